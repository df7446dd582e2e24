"""The listener's protocol alone, on a recording transport: for tests that need reads
split at a chosen byte, or several connections of one server driven in a set order.

`connect_protocol(app, **listen)` makes one protocol instance of the class
`gateway.serving.uvicorn_config` picks (or `http=`) on a `Wire` in the running loop and
calls its `connection_made`; connections given the same `state` (uvicorn's
`ServerState`) count against one connection cap, as those of one server do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.server import ServerState

from gateway.config.schema import ListenSettings
from gateway.serving import uvicorn_config

__all__ = ["Wire", "connect_protocol", "finish"]


class Wire(asyncio.Transport):
    """A transport recording what the protocol writes; `close` reports the loss."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.out = bytearray()
        self.closed = False
        self.protocol: asyncio.Protocol | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def close(self) -> None:
        if not self.closed and self.protocol is not None:
            self.closed = True
            self.loop.call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0  # what is written is taken at once

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8080)}.get(name, default)


def connect_protocol(
    app: Any, *, state: ServerState | None = None, http: type | None = None, **listen: Any
) -> tuple[Any, Wire, set[Any]]:
    """One protocol instance on a `Wire`, in the running loop; also the server's tasks."""
    loop = asyncio.get_running_loop()
    overrides = {} if http is None else {"http": http}
    config = uvicorn_config(app, ListenSettings(**listen), **overrides)
    config.load()
    state = state if state is not None else ServerState()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=state, app_state={}, _loop=loop
    )
    wire = Wire(loop)
    wire.protocol = protocol
    protocol.connection_made(wire)
    return protocol, wire, state.tasks


async def finish(tasks: set[Any]) -> None:
    """Wait until the server's request tasks are done."""
    while tasks:  # a pipelined request starts when the one before it ends
        await asyncio.gather(*list(tasks))
