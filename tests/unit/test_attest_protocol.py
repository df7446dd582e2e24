"""The sidecar's connection (`gateway.attest.protocol.Connection`) over a fake transport:
a client that does not read what it is sent must not make the sidecar run more requests
and buffer their answers without bound, nor hold a request (and its backend connection)
open forever."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from gateway.attest.protocol import Connection, Listener, Request
from tests.helpers.fake_transport import LIMITS, WAIT_S, FakeTransport

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
