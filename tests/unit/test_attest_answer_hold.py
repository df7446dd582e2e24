"""A whole answer's share of the sidecar's answer budget (`Connection.answer`,
`--max-held-answer-bytes`) over a fake transport: given back when its request ends, but
not while the transport still holds bytes of it the client has not read; then once the
client reads them, or is cut off after `write_timeout_s`, or leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from gateway.attest.protocol import Connection, Listener, Request
from gateway.body_budget import BodyBudget
from tests.helpers.fake_transport import LIMITS, WAIT_S, FakeTransport
from tests.helpers.waiting import until_async

_GET = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"


def _answering(
    answers: BodyBudget, done: asyncio.Event, *, unread: bool
) -> Callable[[Connection, Request], Awaitable[None]]:
    async def handler(conn: Connection, request: Request) -> None:
        held = conn.answer = answers.hold(10_000)
        held.cover(1000)
        conn.respond(200, b"x" * 1000, b"application/json")
        if unread:
            conn.pause_writing()  # the transport's buffer is past its high-water mark
        done.set()

    return handler


def _connect(
    answers: BodyBudget, done: asyncio.Event, *, unread: bool, write_timeout_s: float
) -> tuple[Connection, FakeTransport]:
    handler = _answering(answers, done, unread=unread)
    listener = Listener(handler, LIMITS, 4096, keepalive_s=30.0, write_timeout_s=write_timeout_s)
    connection = listener.protocol()
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def test_an_answer_taken_at_once_is_given_back_when_its_request_ends() -> None:
    async def main() -> None:
        answers, done = BodyBudget(), asyncio.Event()
        connection, _ = _connect(answers, done, unread=False, write_timeout_s=30.0)
        connection.data_received(_GET)
        await asyncio.wait_for(done.wait(), WAIT_S)
        await until_async(lambda: connection.task is None, "the request ended")
        assert answers.held == 0

    asyncio.run(main())


def test_an_answer_the_client_has_not_read_stays_held_until_it_reads_it() -> None:
    async def main() -> None:
        answers, done = BodyBudget(), asyncio.Event()
        connection, transport = _connect(answers, done, unread=True, write_timeout_s=30.0)
        connection.data_received(_GET)
        await asyncio.wait_for(done.wait(), WAIT_S)
        await until_async(lambda: connection.task is None, "the request ended")
        assert answers.held == 1000  # still in the transport's buffer
        connection.resume_writing()  # the client read it
        assert answers.held == 0
        assert not transport.closed.is_set()

    asyncio.run(main())


def test_a_client_that_never_reads_its_answer_is_cut_off_and_it_is_given_back() -> None:
    async def main() -> None:
        answers, done = BodyBudget(), asyncio.Event()
        connection, transport = _connect(answers, done, unread=True, write_timeout_s=0.01)
        connection.data_received(_GET)
        await asyncio.wait_for(transport.closed.wait(), WAIT_S)
        assert answers.held == 0
        assert connection.left

    asyncio.run(main())


def test_a_client_that_leaves_with_its_answer_unread_gives_it_back() -> None:
    async def main() -> None:
        answers, done = BodyBudget(), asyncio.Event()
        connection, _ = _connect(answers, done, unread=True, write_timeout_s=30.0)
        connection.data_received(_GET)
        await asyncio.wait_for(done.wait(), WAIT_S)
        await until_async(lambda: connection.task is None, "the request ended")
        assert answers.held == 1000
        connection.connection_lost(None)
        assert answers.held == 0

    asyncio.run(main())


class _ResetTransport(FakeTransport):
    """A transport whose write fails once it is closing, as uvloop's raises
    `RuntimeError` on a connection it closed for a reset (before `connection_lost`)."""

    def write(self, data: bytes) -> None:
        if self.is_closing():
            raise RuntimeError("unable to perform operation: the handler is closed")
        super().write(data)


def test_an_answer_to_a_connection_reset_before_it_is_told_is_dropped_not_a_failure() -> None:
    async def main() -> tuple[int, bytes, bool]:
        done = asyncio.Event()

        async def handler(conn: Connection, request: Request) -> None:
            transport.close()  # reset: closed, `connection_lost` not yet delivered
            conn.respond(200, b"x" * 100, b"application/json")
            conn.start_stream(200, b"text/event-stream")
            await conn.send_chunk(b"data: 1\n\n")
            conn.end_stream(b"")
            done.set()

        listener = Listener(handler, LIMITS, 4096, keepalive_s=30.0, write_timeout_s=30.0)
        connection = listener.protocol()
        transport = _ResetTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(_GET)
        await until_async(lambda: connection.task is None, "the request ended")
        connection.connection_lost(ConnectionResetError())
        return listener.errors, bytes(transport.written), done.is_set()

    errors, written, handled = asyncio.run(main())
    assert handled  # every write returned: none raised into the relay
    assert errors == 0  # not counted (or logged) as a relay failure
    assert written == b""
