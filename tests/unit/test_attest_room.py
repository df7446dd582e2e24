"""The sidecar's listener makes room at its connection cap as the gateway's does
(`gateway/listener_room.py`): a connection past the cap drops one waiting for a request
(tests/integration/test_attest_listener.py), else one whose client reads nothing of its
answer; one being answered to a client that reads is never dropped."""

from __future__ import annotations

import asyncio
import dataclasses

from gateway.attest.protocol import Connection, Listener, Request
from tests.helpers.fake_transport import LIMITS, WAIT_S, FakeTransport

_GET = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"


def _answering(count: int, stalled: tuple[int, ...]) -> tuple[list[bool], bool]:
    """`count` connections (the cap), each with a stream being answered, the clients of
    `stalled` reading none of it (in that order); then one more connection. Which of the
    first are closed, and whether the newcomer is."""

    async def main() -> tuple[list[bool], bool]:
        release = asyncio.Event()
        started: list[asyncio.Event] = []

        async def handler(conn: Connection, request: Request) -> None:
            conn.start_stream(200, b"text/event-stream")
            started[-1].set()
            await release.wait()

        limits = dataclasses.replace(LIMITS, max_connections=count)
        listener = Listener(handler, limits, 4096, keepalive_s=30.0)
        held: list[tuple[Connection, FakeTransport]] = []
        for _ in range(count):
            started.append(asyncio.Event())
            connection, transport = listener.protocol(), FakeTransport()
            connection.connection_made(transport)  # type: ignore[arg-type]
            connection.data_received(_GET)
            await asyncio.wait_for(started[-1].wait(), WAIT_S)
            held.append((connection, transport))
        for number in stalled:
            held[number][0].pause_writing()  # as the transport does with its buffers full
        newcomer = FakeTransport()
        listener.protocol().connection_made(newcomer)  # type: ignore[arg-type]
        closed = [transport.closed.is_set() for _, transport in held]
        release.set()
        for connection, _ in held:
            connection.resume_writing()
            if connection.task is not None:
                await asyncio.wait_for(connection.task, WAIT_S)
        return closed, newcomer.closed.is_set()

    return asyncio.run(main())


def test_a_client_reading_none_of_its_answer_makes_way_stalled_longest_first() -> None:
    """(Before, the newcomer was closed at once while the stalled client held its place
    until the write timeout: a client pipelining requests it never read the answers of
    held every connection.)"""
    assert _answering(3, stalled=(2, 1)) == ([False, False, True], False)


def test_a_newcomer_is_closed_when_every_client_reads_its_answer() -> None:
    assert _answering(2, stalled=()) == ([False, False], True)


def test_a_whole_answer_still_in_the_buffer_is_not_cut_to_make_room() -> None:
    """A's whole answer is written, most of it still in its transport's buffer; B connects
    after, idle. A newcomer drops B (before: A, the oldest waiting, cut off mid-answer).
    Once A's writes resume (its client read the answer), it waits again."""

    async def main() -> tuple[bool, bool, int, int]:
        async def handler(conn: Connection, request: Request) -> None:
            conn.respond(200, b"x" * 65536, b"application/octet-stream")

        limits = dataclasses.replace(LIMITS, max_connections=2)
        listener = Listener(handler, limits, 4096, keepalive_s=30.0)
        answered, sending = listener.protocol(), FakeTransport()
        answered.connection_made(sending)  # type: ignore[arg-type]
        sending.buffered = 60000  # as the transport does while its client reads
        answered.data_received(_GET)
        assert answered.task is not None
        await asyncio.wait_for(answered.task, WAIT_S)
        idle = FakeTransport()
        listener.protocol().connection_made(idle)  # type: ignore[arg-type]
        listener.protocol().connection_made(FakeTransport())  # type: ignore[arg-type]
        before = sum(listener.room.waiting_counts().values())  # the newcomer alone
        sending.buffered = 0
        answered.resume_writing()  # below the low-water mark: waiting again
        after = sum(listener.room.waiting_counts().values())
        return sending.closed.is_set(), idle.closed.is_set(), before, after

    assert asyncio.run(main()) == (False, True, 1, 2)
