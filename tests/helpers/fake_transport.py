"""A fake asyncio transport for protocol tests that need no sockets: it records what is
written, whether reading is paused and whether it was closed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from gateway.listener_limits import ListenerLimits

__all__ = ["LIMITS", "WAIT_S", "FakeTransport"]

WAIT_S = 5.0  # the most a test waits for anything
LIMITS = ListenerLimits(
    max_header_bytes=32768,
    max_headers=100,
    header_timeout_s=30.0,
    body_timeout_s=30.0,
    max_connections=10,
)


class FakeTransport:
    """What the connection uses of a transport; records writes, reading and closing."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.pieces: list[bytes] = []  # what was handed to write(), as handed
        self.reading = True
        self.closed = asyncio.Event()
        self.buffered = 0  # what `get_write_buffer_size` says the transport still holds

    def write(self, data: bytes) -> None:
        self.written += data
        self.pieces.append(data)

    def writelines(self, data: Iterable[bytes]) -> None:
        for piece in data:
            self.write(piece)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.closed.set()

    def abort(self) -> None:
        self.closed.set()

    def is_closing(self) -> bool:
        return self.closed.is_set()

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default
