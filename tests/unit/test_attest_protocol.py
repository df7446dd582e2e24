"""The sidecar's connection (`gateway.attest.protocol.Connection`) over a fake transport:
a client that does not read what it is sent must not make the sidecar run more requests
and buffer their answers without bound, nor hold a request (and its backend connection)
open forever."""

from __future__ import annotations

import asyncio
import dataclasses
import tracemalloc
from collections.abc import Awaitable, Callable

import pytest

from gateway.attest.protocol import MAX_PIPELINED, Connection, Listener, Request
from tests.helpers.fake_transport import LIMITS, WAIT_S, FakeTransport
from tests.helpers.waiting import until_async

_GET = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"

Handler = Callable[[Connection, Request], Awaitable[None]]


def _connect(handler: Handler, write_timeout_s: float = 30.0) -> tuple[Connection, FakeTransport]:
    listener = Listener(handler, LIMITS, 4096, keepalive_s=30.0, write_timeout_s=write_timeout_s)
    connection = listener.protocol()
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


async def _turns(count: int = 10) -> None:
    """Let the loop run what is ready (the fake transport does no I/O: nothing else is)."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_requests_wait_while_the_client_does_not_read_its_answers() -> None:
    """Pipelined requests whose answers the client does not read (the transport paused
    writing) are not run, so the answers cannot pile up in memory; they run once the
    client reads again."""

    async def main() -> None:
        handled: list[bytes] = []
        all_done = asyncio.Event()

        async def handler(conn: Connection, request: Request) -> None:
            handled.append(request.target)
            conn.respond(200, b"x" * 1000, b"application/json")
            if len(handled) == 3:
                all_done.set()

        connection, transport = _connect(handler)
        connection.pause_writing()  # an earlier answer filled the client's buffers
        connection.data_received(_GET * 3)
        await _turns()
        assert handled == []
        assert not transport.reading
        connection.resume_writing()
        await asyncio.wait_for(all_done.wait(), WAIT_S)
        assert len(handled) == 3

    asyncio.run(main())


def test_a_client_that_sends_but_never_reads_runs_one_request_at_a_time() -> None:
    """Requests that come one by one (none pipelined behind a running one) do not each
    run either while the client reads none of the answers."""

    async def main() -> None:
        handled: list[bytes] = []

        async def handler(conn: Connection, request: Request) -> None:
            handled.append(request.target)
            conn.respond(200, b"x" * 1000, b"application/json")
            conn.pause_writing()  # as the transport does past its high-water mark

        connection, _ = _connect(handler)
        for _ in range(5):
            connection.data_received(_GET)
            await _turns()
        assert len(handled) == 1

    asyncio.run(main())


def test_a_client_that_stops_reading_a_stream_is_cut_off() -> None:
    """A stream whose client stops reading waits at most the write timeout, then the
    connection is dropped (and with it the backend's answer), instead of holding the
    request open forever."""

    async def main() -> None:
        finished = asyncio.Event()

        async def handler(conn: Connection, request: Request) -> None:
            conn.start_stream(200, b"text/event-stream")
            conn.pause_writing()
            await conn.send_chunk(b"data: 1\n\n")
            assert conn.left
            finished.set()

        connection, transport = _connect(handler, write_timeout_s=0.05)
        connection.data_received(_GET)
        await asyncio.wait_for(finished.wait(), WAIT_S)
        await asyncio.wait_for(transport.closed.wait(), WAIT_S)

    asyncio.run(main())


def test_a_client_that_never_reads_is_cut_off_between_requests() -> None:
    async def main() -> None:
        async def handler(conn: Connection, request: Request) -> None:
            conn.respond(200, b"x" * 1000, b"application/json")

        connection, transport = _connect(handler, write_timeout_s=0.05)
        connection.pause_writing()
        connection.data_received(_GET)
        await asyncio.wait_for(transport.closed.wait(), WAIT_S)
        assert transport.written == b""

    asyncio.run(main())


def _blocking_handler(
    release: asyncio.Event, handled: list[Request]
) -> Callable[[Connection, Request], Awaitable[None]]:
    async def handler(conn: Connection, request: Request) -> None:
        handled.append(request)
        if len(handled) == 1:
            await release.wait()
        conn.respond(200, b"answer %d" % len(handled), b"application/json")

    return handler


_EXPECT = b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n"


def test_a_request_that_expects_100_continue_behind_a_running_one_gets_it_in_turn() -> None:
    """`100 Continue` for a request that came while another runs is sent once that one
    is answered (not never: the client would wait for it until its body timed out)."""

    async def main() -> None:
        release, handled = asyncio.Event(), list[Request]()
        connection, transport = _connect(_blocking_handler(release, handled))
        connection.data_received(_GET + _EXPECT)
        await _turns()
        assert b"100 Continue" not in transport.written  # not between the first's answer
        release.set()
        assert connection.task is not None
        await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)
        first, _, rest = bytes(transport.written).partition(b"answer 1")
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert rest == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.data_received(b"abc")
        await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)
        assert [r.body for r in handled] == [b"", b"abc"]
        assert transport.written.endswith(b"answer 2")

    asyncio.run(main())


@pytest.mark.parametrize("timer", ["_head_late", "_body_late"])
def test_deadlines_start_over_while_the_sidecar_holds_the_next_request_back(timer: str) -> None:
    """A head or body the sidecar does not read yet (a request waits its turn; `100
    Continue` not sent yet) cannot be late: its deadline does not cut off the running
    request (a stream may run for minutes)."""

    async def main() -> None:
        release, handled = asyncio.Event(), list[Request]()
        limits = dataclasses.replace(LIMITS, header_timeout_s=0.02, body_timeout_s=0.02)
        listener = Listener(_blocking_handler(release, handled), limits, 4096, keepalive_s=30.0)
        connection = listener.protocol()
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        fired = asyncio.Event()
        late = getattr(connection, timer)

        def watched() -> None:
            late()
            fired.set()

        setattr(connection, timer, watched)
        if timer == "_head_late":  # a second request waits its turn, a third's head began
            connection.data_received(_GET + _GET + b"GET /v1/models HTTP/1.1\r\nho")
        else:  # a second request waits for `100 Continue`
            connection.data_received(_GET + _EXPECT)
        await asyncio.wait_for(fired.wait(), WAIT_S)
        assert not transport.closed.is_set()
        release.set()
        await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)  # type: ignore[arg-type]
        assert bytes(transport.written).startswith(b"HTTP/1.1 200 OK\r\n")

    asyncio.run(main())


def test_too_many_headers_are_refused_before_the_head_ends() -> None:
    """As the gateway's listener: the count is refused as it passes the limit, not once a
    head of thousands of tiny fields (each held as Python objects) has been held."""

    async def main() -> None:
        async def handler(conn: Connection, request: Request) -> None:
            raise AssertionError("refused requests are never run")

        connection, transport = _connect(handler)
        connection.data_received(b"GET / HTTP/1.1\r\n" + b"x: y\r\n" * (LIMITS.max_headers + 50))
        assert transport.written.startswith(b"HTTP/1.1 431 ")

    asyncio.run(main())


def test_a_request_cut_off_by_a_refusal_of_the_next_is_not_answered() -> None:
    """A malformed request behind a running one closes the connection (a second answer
    would corrupt the first): the running request counts as left then, so the relay
    signs nothing for an answer the client will not get whole."""

    async def main() -> None:
        release, seen = asyncio.Event(), []

        async def handler(conn: Connection, request: Request) -> None:
            await release.wait()
            seen.append(conn.left)
            conn.respond(200, b"answer", b"application/json")

        connection, transport = _connect(handler)
        connection.data_received(_GET + b"GET / HTTP/1.1\r\nbad header\r\n\r\n")
        assert transport.closed.is_set()
        release.set()
        assert connection.task is not None
        await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)
        assert seen == [True]
        assert b"answer" not in transport.written

    asyncio.run(main())


def test_a_body_in_tiny_chunks_is_held_at_about_its_size() -> None:
    """Each chunk's data was kept as a bytes object of its own until the body ended: a
    body sent as 2-byte chunks (within the framing limit per read) held ~22 bytes of
    memory per body byte, ~370 MB for one 16 MiB body."""

    async def main() -> None:
        async def handler(conn: Connection, request: Request) -> None:
            conn.respond(200, b"%d" % len(request.body), b"application/json")

        listener = Listener(handler, LIMITS, 1 << 24, keepalive_s=30.0)
        connection = listener.protocol()
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(b"POST /v1/x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n")
        read = b"2\r\naa\r\n" * 6000  # 12,000 body bytes in 42,000: under the framing limit
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(50):
                connection.data_received(read)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert transport.written == b""  # not refused: still arriving
        assert held < 3 * 50 * 12_000
        connection.data_received(b"0\r\n\r\n")
        assert connection.task is not None
        await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)
        assert transport.written.endswith(b"\r\n\r\n600000")

    asyncio.run(main())


def test_requests_pipelined_in_one_read_are_held_at_about_their_size() -> None:
    """Every request of a read was parsed and queued behind the running one: one 256 KiB
    read of small requests with empty headers held ~6 MB (each header a tuple of two
    bytes objects), per connection. Past `MAX_PIPELINED` waiting requests the connection
    is closed, as for any request that cannot be answered in turn."""

    async def main() -> None:
        release = asyncio.Event()

        async def handler(conn: Connection, request: Request) -> None:
            await release.wait()
            conn.respond(200, b"{}", b"application/json")

        connection, transport = _connect(handler)
        small = b"GET / HTTP/1.1\r\n" + b"a:\r\n" * 60 + b"\r\n"
        read = small * (262144 // len(small))
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            connection.data_received(read)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert held < len(read)
        assert transport.closed.is_set()
        release.set()
        assert connection.task is not None
        await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)

    asyncio.run(main())


def test_a_few_pipelined_requests_are_all_answered_in_turn() -> None:
    async def main() -> None:
        handled: list[bytes] = []

        async def handler(conn: Connection, request: Request) -> None:
            handled.append(request.target)
            conn.respond(200, b"{}", b"application/json")

        connection, transport = _connect(handler)
        connection.data_received(_GET * (MAX_PIPELINED + 1))
        await until_async(lambda: len(handled) == MAX_PIPELINED + 1, "every request answered")
        assert not transport.closed.is_set()

    asyncio.run(main())


def test_bodies_of_requests_that_never_run_are_given_back_when_the_client_leaves() -> None:
    """Pipelined requests wait behind a running one holding their bodies against the
    listener's budget (`--max-held-body-bytes`); a client that leaves before they run gets
    them given back, and the running one's when its handler ends."""

    async def main() -> None:
        release, handled = asyncio.Event(), list[Request]()
        listener = Listener(
            _blocking_handler(release, handled), LIMITS, 4096, keepalive_s=30.0, max_held_body=100
        )
        connection = listener.protocol()
        connection.connection_made(FakeTransport())  # type: ignore[arg-type]
        post = b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n0123456789"
        connection.data_received(post * 3)
        await _turns()
        assert len(handled) == 1
        assert listener.bodies.held == 30
        task = connection.task
        connection.connection_lost(None)
        assert listener.bodies.held == 10  # the running request's, until its handler ends
        release.set()
        await asyncio.wait_for(asyncio.shield(task), WAIT_S)  # type: ignore[arg-type]
        assert listener.bodies.held == 0

    asyncio.run(main())


def test_the_body_of_a_request_cut_off_before_it_runs_is_given_back() -> None:
    """A client that reads none of its earlier answers is cut off before its next request
    runs (`write_timeout_s`): that request's body is not held any longer."""

    async def main() -> None:
        async def handler(conn: Connection, request: Request) -> None:
            raise AssertionError("a request cut off before its turn never runs")

        connection, transport = _connect(handler, write_timeout_s=0.01)
        connection.pause_writing()  # an earlier answer filled the client's buffers
        connection.data_received(b"POST /v1/x HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
        task = connection.task
        assert connection._listener.bodies.held == 2
        await asyncio.wait_for(asyncio.shield(task), WAIT_S)  # type: ignore[arg-type]
        assert transport.closed.is_set()
        assert connection._listener.bodies.held == 0

    asyncio.run(main())


def test_a_whole_answer_goes_out_behind_its_head_without_a_copy() -> None:
    """The answer's body is handed to the transport as it came (one writev with the head),
    not copied into a buffer behind the head: a copy costs as much as the body is long."""

    async def main() -> None:
        body = b'{"answer": "%s"}' % (b"x" * 100_000)
        done = asyncio.Event()

        async def handler(conn: Connection, request: Request) -> None:
            conn.respond(200, body, b"application/json")
            done.set()

        connection, transport = _connect(handler)
        connection.data_received(_GET)
        await asyncio.wait_for(done.wait(), WAIT_S)
        assert transport.pieces[-1] is body
        head = bytes(transport.written[: -len(body)])
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"content-length: %d\r\n" % len(body) in head
        assert transport.written.endswith(b"\r\n\r\n" + body)

    asyncio.run(main())
