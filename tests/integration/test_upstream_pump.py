"""`UpstreamResponse.pump`: a body handed to a sink from the connection's callbacks, with
the limits of `chunks()` (read timeout, deadline, failures) and flow control."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable

import pytest

from gateway.upstream.http import HttpPool, UpstreamError
from tests.helpers.scripted_upstream import dripping, read_request, with_backend
from tests.helpers.waiting import until_async

Sink = Callable[[bytes], bool]


async def _ready() -> None:
    """A drain with nothing to wait for."""


def _collect(into: list[bytes], tasks: list[asyncio.Task[object] | None]) -> Sink:
    def sink(data: bytes) -> bool:
        into.append(data)
        tasks.append(asyncio.current_task())
        return True

    return sink


def test_every_byte_reaches_the_sink_and_the_connection_goes_back_to_the_pool() -> None:
    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []
        await response.pump(_collect(received, []), _ready)
        assert b"".join(received) == b"x" * 30
        assert response.complete
        assert len(pool._idle) == 1  # released clean, kept alive

    asyncio.run(with_backend(dripping(30, 0.002, then_stall=False), body))


def test_reads_reach_the_sink_from_callbacks_not_the_pump_s_task() -> None:
    # What makes the pump cheap: a paced read costs no wake-up of the relaying task.
    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []
        tasks: list[asyncio.Task[object] | None] = []
        await response.pump(_collect(received, tasks), _ready)
        assert b"".join(received) == b"x" * 20
        from_callbacks = sum(task is None for task in tasks)
        assert from_callbacks >= len(tasks) - 1, tasks  # at most one read found buffered

    asyncio.run(with_backend(dripping(20, 0.005, then_stall=False), body))


def test_the_read_timeout_runs_from_the_last_bytes_handed_on() -> None:
    # 20 reads 50 ms apart (1 s) outlast the 800 ms read timeout in all: only the stall
    # cuts. Each gap leaves 750 ms of slack (it was 250 ms: a busy machine's pause of the
    # process between two reads fired the timer early and cut the drip short).
    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []
        with pytest.raises(UpstreamError) as info:
            await response.pump(_collect(received, []), _ready)
        assert info.value.kind == "timeout"
        assert info.value.detail == "backend stopped sending mid-response"
        assert b"".join(received) == b"x" * 20
        assert pool.open_connections == 0  # dropped: the backend sees it

    asyncio.run(with_backend(dripping(20, 0.05, then_stall=True), body, read_timeout=0.8))


def test_a_steady_stream_is_cut_at_its_deadline() -> None:
    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []
        deadline = asyncio.get_running_loop().time() + 0.3
        with pytest.raises(UpstreamError) as info:
            await response.pump(_collect(received, []), _ready, deadline)
        assert info.value.kind == "timeout"
        assert info.value.detail == "the answer did not end in time"
        assert 0 < len(b"".join(received)) < 1000
        assert pool.open_connections == 0

    # 1,000 reads 10 ms apart: every read in time, the whole far past the deadline
    asyncio.run(with_backend(dripping(1000, 0.01, then_stall=False), body, read_timeout=1.0))


def test_a_full_sink_pauses_reading_from_the_backend_until_it_drains() -> None:
    # The client's buffers are full: the backend must not be read on into memory.
    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []
        draining = asyncio.Event()
        may_go_on = asyncio.Event()

        def sink(data: bytes) -> bool:
            received.append(data)
            return len(received) > 1  # full after the first piece

        async def drain() -> None:
            draining.set()
            await may_go_on.wait()

        pumping = asyncio.create_task(response.pump(sink, drain))
        await asyncio.wait_for(draining.wait(), 5)
        transport = response._conn.transport
        assert transport is not None
        assert not transport.is_reading()  # paused while the sink is full
        assert len(received) == 1
        may_go_on.set()
        await asyncio.wait_for(pumping, 5)
        assert b"".join(received) == b"x" * 30
        assert len(pool._idle) == 1

    asyncio.run(with_backend(dripping(30, 0.002, then_stall=False), body))


def test_a_sink_that_raises_ends_the_pump_with_its_error() -> None:
    class Refused(Exception):
        pass

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        calls: list[bytes] = []

        def sink(data: bytes) -> bool:
            calls.append(data)
            if len(calls) == 2:
                raise Refused
            return True

        with pytest.raises(Refused):
            await response.pump(sink, _ready)
        assert len(calls) == 2  # not called again after it raised
        response.abort()  # what the relay does with a pump that raised
        assert pool.open_connections == 0

    asyncio.run(with_backend(dripping(30, 0.005, then_stall=False), body))


def test_a_backend_that_breaks_off_mid_body_fails_the_pump() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        writer.transport.abort()

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []
        with pytest.raises(UpstreamError) as info:
            await response.pump(_collect(received, []), _ready)
        assert info.value.kind == "closed"
        assert b"".join(received) == b"abc"  # what came before the break is handed on

    asyncio.run(with_backend(handler, body))


def test_reads_of_one_loop_turn_reach_the_sink_as_one_piece() -> None:
    # A backend writing back to back (a zero-delay server): relayed in as few writes as
    # the reads allow, not one write per event.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"".join(b"1\r\n%d\r\n" % (i % 10) for i in range(50)) + b"0\r\n\r\n")
        await writer.drain()

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []
        await response.pump(_collect(received, []), _ready)
        assert b"".join(received) == b"".join(b"%d" % (i % 10) for i in range(50))
        assert len(received) < 5, received  # 50 chunks, one read: not 50 sink calls

    asyncio.run(with_backend(handler, body))


def test_a_sink_full_at_the_body_s_end_leaves_the_pooled_connection_reading() -> None:
    # The last read (its data and the body's end together) fills the client's buffers:
    # the pump pauses reading, waits for the drain, then finds the body complete. The
    # connection goes back to the pool; paused, its next answer would never be read (a
    # first-byte timeout charged to a healthy backend).
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in (b"3\r\nabc\r\n0\r\n\r\n", b"2\r\nok\r\n0\r\n\r\n"):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + answer)
            await writer.drain()

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []

        def sink(data: bytes) -> bool:
            received.append(data)
            return False  # the client's buffers are full after every piece

        await asyncio.wait_for(response.pump(sink, _ready), 5)
        assert b"".join(received) == b"abc"
        assert len(pool._idle) == 1
        transport = pool._idle[0].transport
        assert transport is not None
        assert transport.is_reading()  # pooled, and reading again
        again = await pool.request(b"POST", b"/", [], b"{}")
        assert await again.read() == b"ok"

    asyncio.run(with_backend(handler, body, first_byte_timeout=1.0))


def test_a_read_that_came_in_time_is_not_cut_by_a_timer_that_runs_before_its_hand_on() -> None:
    # The loop runs a turn's due timers before the callbacks its reads scheduled (uvloop:
    # timers, then `call_soon` callbacks; asyncio: I/O callbacks, then timers, then what
    # they scheduled). A read that arrived before the read timeout ran out, but is handed
    # on only after the timer looked, must count: `chunks()` woke its waiter at the read.
    writers: list[asyncio.StreamWriter] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        writers.append(writer)
        await asyncio.Event().wait()  # the test writes the rest

    async def body(pool: HttpPool) -> None:
        loop = asyncio.get_running_loop()
        response = await pool.request(b"POST", b"/", [], b"{}")
        received: list[bytes] = []
        pumping = asyncio.create_task(response.pump(_collect(received, []), _ready))
        await until_async(lambda: received == [b"a"] and bool(writers), "the first read")
        # The rest reaches the socket in time; the loop is busy (this task) until the read
        # timeout has run out, so the read and the timer come in the same turn.
        writers[0].write(b"1\r\nb\r\n")  # not the end yet: that would wake the pump
        due = response._due
        while loop.time() < due:  # blocking the loop (no await) is the point
            time.sleep(0.001)  # noqa: ASYNC251
        await until_async(lambda: len(received) == 2 or pumping.done(), "the second read")
        writers[0].write(b"0\r\n\r\n")
        await asyncio.wait_for(pumping, 5)
        assert received == [b"a", b"b"]

    asyncio.run(with_backend(handler, body, read_timeout=0.3))


def test_the_sink_runs_in_the_pump_s_context_not_the_connection_s() -> None:
    # The connection's callbacks run in the context it was opened in (another request's,
    # once pooled); what the sink logs or traces must be this request's.
    request: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")

    async def body(pool: HttpPool) -> None:
        response = await pool.request(b"POST", b"/", [], b"{}")  # opened with "none"
        request.set("this one")
        seen: list[str] = []

        def sink(data: bytes) -> bool:
            seen.append(request.get())
            return True

        await response.pump(sink, _ready)
        assert seen and set(seen) == {"this one"}, seen

    asyncio.run(with_backend(dripping(10, 0.005, then_stall=False), body))
