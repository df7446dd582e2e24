"""The listener's protocol for one connection on the running loop, and a transport that
records what it writes: protocol tests without a socket."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.server import ServerState

from gateway.config.schema import ListenSettings
from gateway.listener import LimitedHttpProtocol, http_protocol
from gateway.serving import uvicorn_config

__all__ = ["GET", "App", "RecordingTransport", "listener_protocol"]


class RecordingTransport:
    """What the protocol and its cycles call on a transport; writes are recorded."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.eof = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        # asyncio and uvloop raise here (in a loop callback: a logged traceback)
        assert not self.eof, "written after write_eof"
        self.writes.append(bytes(data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5), "sockname": ("127.0.0.1", 80)}.get(name, default)

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def set_write_buffer_limits(self, *args: Any) -> None: ...
    def get_write_buffer_size(self) -> int:
        return 0


GET = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n"


App = Callable[[Any, Any, Any], Awaitable[None]]


def listener_protocol(app: App) -> LimitedHttpProtocol:
    """The listener's protocol for one connection to `app`, on the running loop."""
    config = uvicorn_config(app, ListenSettings())
    config.load()
    return http_protocol(ListenSettings())(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
