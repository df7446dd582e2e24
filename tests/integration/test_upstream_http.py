"""The upstream HTTP/1.1 client against scripted backends that misbehave on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
from typing import Any
from unittest import mock

import pytest

from gateway.upstream.http import HttpPool, UpstreamError, UpstreamResponse
from tests.helpers.scripted_upstream import (
    dripping,
    endless_head_refused,
    read_request,
    with_backend,
)
from tests.helpers.waiting import until_async


def test_interim_1xx_is_skipped_and_the_connection_stays_in_step() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for n in range(2):
            await read_request(reader)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            body = b'{"answer": %d}' % n
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        writer.close()

    async def body(pool: HttpPool) -> None:
        for n in range(2):
            response = await pool.request(b"POST", b"/", [], b"{}")
            assert response.status == 200
            assert response.header(b"link") is None
            assert await response.read() == b'{"answer": %d}' % n

    asyncio.run(with_backend(handler, body))


def test_switching_protocols_is_a_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()

    async def body(pool: HttpPool) -> None:
        with pytest.raises(UpstreamError) as info:
            await pool.request(b"POST", b"/", [], b"{}")
        assert info.value.kind == "protocol"
        assert pool.open_connections == 0

    asyncio.run(with_backend(handler, body))


def test_close_delimited_body_is_complete() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        assert await response.read() == b"all of it"
        assert pool.open_connections == 0  # not pooled: the backend closed it

    asyncio.run(with_backend(handler, body))


def test_bytes_after_a_complete_response_are_dropped_with_the_connection() -> None:
    dropped = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst")
        await writer.drain()
        await asyncio.sleep(0.05)  # a separate read on the gateway's side, before it reads
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nSMUGGLED!")
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            await reader.read(1)  # b"" or a reset: the client dropped the connection
        dropped.set()

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        await dropped.wait()  # the extra bytes arrived before the body was read
        assert await response.read() == b"first"
        assert pool.open_connections == 0  # dropped, never pooled

    asyncio.run(with_backend(handler, body))


def test_read_stops_at_its_limit_and_drops_the_connection() -> None:
    written = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        piece = b"x" * 65536
        for _ in range(1024):  # 64 MiB, if nobody stops it
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            written[0] += len(piece)

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        with pytest.raises(UpstreamError) as info:
            await response.read()
        assert info.value.kind == "too_large"
        assert pool.open_connections == 0

    asyncio.run(with_backend(handler, body, max_body=1024 * 1024))
    assert written[0] < 16 * 1024 * 1024  # the limit, plus what socket buffers held


def test_read_deadline_ends_a_body_that_keeps_dripping() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
        for _ in range(1000):  # each byte well within the read timeout: 20 s in all
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.02)

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        with pytest.raises(UpstreamError) as info:
            await response.read()
        assert info.value.kind == "timeout"
        assert info.value.detail == "the answer did not end in time"
        assert pool.open_connections == 0

    asyncio.run(with_backend(handler, body, response_timeout=0.3))


def test_full_pool_waits_then_reports_busy_not_a_backend_fault() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await release.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def body(pool: HttpPool) -> None:
        held = [asyncio.create_task(pool.request(b"POST", b"/", [], b"")) for _ in range(4)]
        await until_async(lambda: pool.open_connections == 4, "the pool full", timeout=10.0)
        with pytest.raises(UpstreamError) as info:
            await pool.request(b"POST", b"/", [], b"")
        assert info.value.kind == "busy"
        release.set()
        for task in held:
            await (await task).read()

    asyncio.run(with_backend(handler, body, connect_timeout=0.2))


def test_cancelled_connect_gives_its_slot_back() -> None:
    # A listener that never accepts, with its queue full: new connects hang in SYN.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)

    async def body() -> None:
        pool = HttpPool(
            "127.0.0.1",
            port,
            connect_timeout=5.0,
            first_byte_timeout=5.0,
            read_timeout=5.0,
            max_connections=1,
        )
        task = asyncio.create_task(pool.request(b"POST", b"/", [], b""))
        await until_async(lambda: pool.open_connections == 1, "the connect under way")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.open_connections == 0
        assert not pool.saturated

    try:
        asyncio.run(body())
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_a_whole_answer_in_one_read_is_read_at_once_and_held_to_the_limit() -> None:
    """An answer whose body came with its head (`read()` takes it without waiting):
    within the limit it is returned and the connection pooled; past it, too_large and
    the connection dropped, as for an answer that arrives in pieces."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            size = 2048 if b"big" in request else 16
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (size, b"y" * size))
            await writer.drain()

    async def body(pool: HttpPool) -> None:
        for _ in range(2):
            response = await pool.request(b"POST", b"/", [], b"{}")
            await _until_complete(response)
            assert await response.read() == b"y" * 16
            assert pool.open_connections == 1  # pooled and reused
        response = await pool.request(b"POST", b"/", [], b"big")
        await _until_complete(response)
        with pytest.raises(UpstreamError) as info:
            await response.read(limit=1024)
        assert info.value.kind == "too_large"
        assert pool.open_connections == 0

    asyncio.run(with_backend(handler, body))


async def _until_complete(response: UpstreamResponse) -> None:
    """Let the loop run until the body that came right after the head is in (bounded)."""
    for _ in range(10_000):
        if response.complete:
            return
        await asyncio.sleep(0)  # one loop iteration: the connection's reads run
    raise AssertionError("the answer did not complete")


def test_the_read_timeout_runs_from_the_last_bytes_not_the_first_read() -> None:
    # 30 chunks 50 ms apart outlast a 1 s read timeout in all; each read is in time (with
    # 950 ms to spare for a busy machine: 300 ms failed once beside other work), so the
    # stream is cut only once the backend stops sending.
    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []

        async def drain() -> None:
            async for chunk in response.chunks():
                received.append(chunk)

        with pytest.raises(UpstreamError) as info:
            await drain()
        assert info.value.kind == "timeout"
        assert info.value.detail == "backend stopped sending mid-response"
        assert b"".join(received) == b"x" * 30
        assert pool.open_connections == 0

    asyncio.run(with_backend(dripping(30, 0.05, then_stall=True), body, read_timeout=1.0))


def test_a_stream_arms_one_timer_not_one_per_read() -> None:
    armed: list[str] = []  # the timers' callbacks, but the backend's own sleeps

    def note(callback: Any) -> None:
        name = getattr(callback, "__name__", repr(callback))
        if name != "_set_result_unless_cancelled":  # asyncio.sleep, in the backend here
            armed.append(name)

    async def body(pool: HttpPool) -> None:
        loop = asyncio.get_running_loop()
        call_at, call_later = loop.call_at, loop.call_later

        def counted_at(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
            note(callback)
            return call_at(when, callback, *args, **kw)

        def counted_later(
            delay: float, callback: Any, *args: Any, **kw: Any
        ) -> asyncio.TimerHandle:
            note(callback)
            return call_later(delay, callback, *args, **kw)

        response = await pool.request(b"POST", b"/", [], b"{}")
        with (
            mock.patch.object(loop, "call_at", counted_at),
            mock.patch.object(loop, "call_later", counted_later),
        ):
            received = b"".join([chunk async for chunk in response.chunks()])
        assert received == b"x" * 40
        # a read that finds nothing buffered waits; 40 separate writes mean ~40 waits
        assert len(armed) <= 2, armed

    asyncio.run(with_backend(dripping(40, 0.005, then_stall=False), body))


def test_response_headers_past_their_limit_drop_the_connection() -> None:
    # httptools gathers a header line whole before handing it over: a backend that never
    # ends one (a countersignature header that goes on and on) must not grow the
    # gateway's memory until the first-byte timeout.
    endless_head_refused(b"HTTP/1.1 200 OK\r\nx-owngate-attest: ", b"A" * 65536, "response headers")


def test_many_small_response_headers_count_towards_the_limit() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(1024):
            writer.write(b"x-a: b\r\n" * 8192)
            await writer.drain()

    async def body(pool: HttpPool) -> None:
        with pytest.raises(UpstreamError) as info:
            await pool.request(b"POST", b"/", [], b"{}")
        assert info.value.kind == "protocol"

    asyncio.run(with_backend(handler, body, first_byte_timeout=600.0, read_timeout=600.0))


def test_a_request_on_a_pooled_connection_asks_no_running_loop() -> None:
    """`asyncio.get_running_loop()` makes a `getpid` system call each time (its fork
    check): a request on a pooled connection takes the loop the connection keeps."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        assert await response.read() == b"ok"  # the connection is made and pooled
        with mock.patch.object(
            asyncio, "get_running_loop", side_effect=AssertionError("asked")
        ) as asked:
            for _ in range(2):
                response = await pool.request(b"POST", b"/", [], b"{}")
                assert await response.read() == b"ok"
        assert asked.call_count == 0
        assert pool.open_connections == 1

    asyncio.run(with_backend(handler, body))


def test_a_pooled_connection_registers_its_socket_for_the_unread_check_once() -> None:
    """Before each reuse the connection is polled for bytes nobody asked for; the poll
    object is made and the socket registered once per connection, not per request."""
    made: list[object] = []
    real_poll = select.poll

    def poll() -> Any:
        made.append(real_poll())
        return made[-1]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    async def body(pool: HttpPool) -> None:
        with mock.patch.object(select, "poll", poll):
            for _ in range(4):
                response = await pool.request(b"POST", b"/", [], b"{}")
                assert await response.read() == b"ok"
        assert pool.open_connections == 1
        assert len(made) == 1  # three reuses, one poll object

    asyncio.run(with_backend(handler, body))
