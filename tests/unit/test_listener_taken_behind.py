"""An answer is taken once the kernel took its own bytes (`BodyWriter.taken`), whatever the
connection's write buffer holds behind them: a later pipelined answer, or the listener's
refusal of what the client sent next. Driven on the listener's protocol with a transport
whose write buffer the test empties from the front, as the kernel takes it (no socket).

Before, the wait was for the whole buffer to empty: a client that read the first answer to
its last byte and then reset, the later answer (or the refusal) unread, was recorded 499,
the signed log saying it never got the answer it read. Whole answers here; a stream, over a
socket: tests/integration/test_log_truth_stream_end_unread.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.body_writer import body_writer
from tests.helpers.listener_protocol import GET, RecordingTransport, listener_protocol
from tests.helpers.waiting import until_async


class _Kernel(RecordingTransport):
    """A transport whose write buffer keeps what is written until `take` hands its first
    bytes to the kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = bytearray()
        self.looks = 0  # times the buffer's size was asked (a wait's look among them)

    def write(self, data: bytes) -> None:
        super().write(data)
        self.buffer += data

    def take(self, size: int) -> None:
        del self.buffer[:size]

    def get_write_buffer_size(self) -> int:
        self.looks += 1
        return len(self.buffer)


class _Answers:
    """Answers each request whole (in one write: its head held for its body), then waits
    for its answer to be taken; `answered` counts the answers handed over, `taken` holds
    each wait's result."""

    def __init__(self) -> None:
        self.answered = 0
        self.taken: list[bool] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * 100})
        self.answered += 1
        writer = body_writer(scope)
        assert writer is not None
        self.taken.append(await writer.taken())


async def _first_taken_behind(
    behind: bytes, behind_written: Callable[[_Answers, _Kernel], bool]
) -> list[bool]:
    """A request, then `behind` in the same read; once `behind_written` says what answers
    it is in the write buffer behind the first answer, the kernel takes the first answer's
    bytes and the client resets: what each answer's wait said."""
    transport = _Kernel()
    answers = _Answers()
    protocol = listener_protocol(answers)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(GET + behind)
    await until_async(lambda: behind_written(answers, transport), "written behind", timeout=10)
    first = len(transport.writes[0])  # the first answer, whole (to its last chunk)
    assert transport.writes[0].endswith(b"\r\n0\r\n\r\n"), transport.writes
    assert transport.get_write_buffer_size() > first, "nothing behind the first answer"
    transport.take(first)  # the client read the first answer, to its last byte
    looks = transport.looks
    await until_async(lambda: transport.looks > looks, "a wait's look", timeout=10, interval=0)
    protocol.connection_lost(ConnectionResetError())  # then reset: what is behind is lost
    await asyncio.wait_for(asyncio.gather(*protocol.tasks), 10)
    return answers.taken


def test_an_answer_taken_whole_is_taken_with_a_later_answer_unread_behind_it() -> None:
    taken = asyncio.run(_first_taken_behind(GET, lambda answers, _: answers.answered == 2))
    assert taken == [True, False]  # the second one's bytes went unread: the reset lost them


def test_an_answer_taken_whole_is_taken_with_a_refusal_unread_behind_it() -> None:
    def refused(answers: _Answers, transport: _Kernel) -> bool:  # written, then its EOF
        return answers.answered == 1 and transport.eof

    taken = asyncio.run(_first_taken_behind(b"NOT HTTP\r\n\r\n", refused))
    assert taken == [True]


class _Stream:
    """Answers one stream: its head and first chunk through `send`, then (once `go` is set)
    chunks written past the coalescer (`BodyWriter.ready` gave the cycle the connection's
    own transport), then its end through `send` again (`guard`), as the private relay
    does (gateway/api/stream_relay.py); then waits for it to be taken."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.started = self.ended = False
        self.past_coalescer = False
        self.taken: list[bool] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        writer = body_writer(scope)
        assert writer is not None
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        self.started = True
        await self.go.wait()
        assert writer.ready()
        cycle = writer.cycle_ref()
        self.past_coalescer = cycle is not None and isinstance(cycle.transport, _Kernel)
        for _ in range(10):
            writer.write(b"y" * 100)
        writer.guard()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.ended = True
        self.taken.append(await writer.taken())


async def _stream_unread_past_coalescer() -> tuple[_Stream, bool]:
    """A stream whose head and first chunk the kernel took before its relay looked
    (`ready`: an empty buffer, every earlier byte taken); its later chunks, uncounted,
    and its end stay unread; a wait's look, then a reset: the stream's wait says, and
    whether it said taken before the reset."""
    transport = _Kernel()
    stream = _Stream()
    protocol = listener_protocol(stream)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(GET)
    await until_async(lambda: stream.started, "the stream started", timeout=10)
    await until_async(lambda: bool(transport.buffer), "its first chunk written", timeout=10)
    transport.take(len(transport.buffer))  # head and first chunk: the kernel's
    stream.go.set()
    await until_async(lambda: stream.ended, "the stream ended", timeout=10)
    looks = transport.looks
    await until_async(  # (or its answer: said at its first look)
        lambda: bool(stream.taken) or transport.looks > looks, "a wait's look", timeout=10
    )
    early = bool(stream.taken)
    protocol.connection_lost(ConnectionResetError())
    await asyncio.wait_for(asyncio.gather(*protocol.tasks), 10)
    return stream, early


def test_a_stream_whose_uncounted_chunks_are_unread_is_not_taken() -> None:
    """The count (`ConnectionLoss.sent`) skips a stream's chunks written past the coalescer;
    what keeps its wait true is that the stream's end goes through the coalescer again
    (`BodyWriter.guard`), counted after them. Written past it too, the end was at the count
    a look at the empty buffer had seen taken: the wait said taken at once, its chunks and
    end unread (200 for a stream the client never got the end of)."""
    stream, early = asyncio.run(_stream_unread_past_coalescer())
    assert stream.past_coalescer, "the chunks went through the coalescer: nothing tested"
    assert not early and stream.taken == [False], stream.taken
