"""A scripted backend on an asyncio server (the test's handler reads and writes the raw
bytes) and an `HttpPool` to it: the upstream client's tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.upstream.http import HttpPool, UpstreamError
from tests.helpers.accepted import close_server

__all__ = ["Handler", "dripping", "endless_head_refused", "read_request", "with_backend"]


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def with_backend(
    handler: Handler, body: Callable[[HttpPool], Awaitable[None]], **pool_options: Any
) -> None:
    handlers: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client side went away: that is what some tests do
        except asyncio.CancelledError:
            # Cancelled by `with_backend` as it ends: the task must not end cancelled
            # (Python 3.11's stream server asks a finished handler's task for its
            # exception in a done callback, which raises for a cancelled one and is
            # logged as an error; tests/helpers/accepted.py).
            writer.transport.abort()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    options: dict[str, Any] = {
        "connect_timeout": 1.0,
        "first_byte_timeout": 2.0,
        "read_timeout": 2.0,
        "max_connections": 4,
        **pool_options,
    }
    pool = HttpPool("127.0.0.1", port, **options)
    try:
        await body(pool)
    finally:
        await pool.close()
        await close_server(server)  # no accepted connection lost in the close (accepted.py)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


def dripping(chunks: int, gap_s: float, then_stall: bool) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(chunks):
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(gap_s)
        if then_stall:
            await asyncio.Event().wait()  # stops sending, keeps the connection open
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return handler


def endless_head_refused(first: bytes, piece: bytes, detail: str) -> None:
    """A backend that answers `first`, then `piece` again and again (64 MiB, if nobody stops
    it), no timeout firing: the request fails as `protocol` with `detail` in its reason,
    its connection closed, after the backend wrote no more than the head's limit and what
    socket buffers hold."""
    written = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(first)
        for _ in range(64 * 1024 * 1024 // len(piece)):
            writer.write(piece)
            await writer.drain()
            written[0] += len(piece)

    async def body(pool: HttpPool) -> None:
        with pytest.raises(UpstreamError) as info:
            await pool.request(b"POST", b"/", [], b"{}")
        assert info.value.kind == "protocol"
        assert detail in info.value.detail
        assert pool.open_connections == 0

    asyncio.run(with_backend(handler, body, first_byte_timeout=600.0, read_timeout=600.0))
    assert written[0] < 16 * 1024 * 1024
