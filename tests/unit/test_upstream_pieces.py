"""A stream's read handed on in pieces, the event loop turning between them: what a relay
does with a read costs Python per line and per event (the comment filter; the event
reader, which parses every event), so a backend writing 256 KiB reads of blank lines,
comment lines or tiny events held the loop some 0.25 s a read, and a 4 MiB burst of
blank lines kept a `/healthz` beside it waiting 5.9 s (an in-process gateway).
Counted here, not timed: the largest piece handed on, and the turns a task beside got
between two pieces."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

from gateway.upstream.connection import _Connection
from gateway.upstream.response import UpstreamResponse
from tests.helpers.python_calls import by_qualname, python_calls
from tests.helpers.waiting import until_async

# The most of a read handed on at once (`PIECE` in gateway/upstream/response.py).
PIECE = 16 * 1024
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
# One read of a hostile backend: a chunk of 256 KiB of blank lines, then a last event.
_BURST = b"\n" * (256 * 1024)
_LAST = b"data: [DONE]\n\n"
_READ = b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(_BURST), _BURST, len(_LAST), _LAST)


class _Transport:
    def __init__(self) -> None:
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _connection() -> tuple[_Connection, UpstreamResponse, _Transport]:
    pool = SimpleNamespace(tls=None, _put_idle=lambda conn: None, _forget=lambda conn: None)
    conn = _Connection(cast(Any, pool))
    transport = _Transport()
    conn.transport = cast(Any, transport)
    response = UpstreamResponse(conn, 30.0)
    conn.response = response
    conn.data_received(_HEAD)
    assert response.status == 200
    return conn, response, transport


async def _beside(turns: list[int], done: asyncio.Event) -> None:
    while not done.is_set():
        turns[0] += 1
        await asyncio.sleep(0)


async def _ready() -> None:
    """A drain with nothing to wait for."""


def test_a_large_read_reaches_the_pump_s_sink_in_pieces_with_turns_between() -> None:
    async def run() -> tuple[list[tuple[int, int]], bool]:
        conn, response, transport = _connection()
        turns, done = [0], asyncio.Event()
        pieces: list[tuple[int, int]] = []  # (its size, the turns the task beside had)
        received: list[bytes] = []
        paused_between: list[bool] = []

        def sink(data: bytes) -> bool:
            pieces.append((len(data), turns[0]))
            received.append(data)
            paused_between.append(not transport.reading)
            return True

        beside = asyncio.create_task(_beside(turns, done))
        pump = asyncio.create_task(response.pump(sink, _ready))
        await until_async(lambda: response._sink is not None, "the pump waits for reads")
        conn.data_received(_READ)  # one read, all of it ready at once
        await asyncio.wait_for(pump, 30)
        done.set()
        await beside
        assert b"".join(received) == _BURST + _LAST
        return pieces, transport.reading

    pieces, reading = asyncio.run(run())
    sizes = [size for size, _ in pieces]
    assert max(sizes) <= PIECE, sizes  # was one piece of 256 KiB: the loop held for it all
    assert len(pieces) >= len(_BURST) // PIECE
    seen = [turn for _, turn in pieces]
    assert all(later > earlier for earlier, later in itertools.pairwise(seen)), seen
    assert reading  # the response ended: reading resumed for the next one


def test_a_stream_s_chunks_are_pieces_with_turns_between() -> None:
    async def run() -> list[tuple[int, int]]:
        conn, response, _ = _connection()
        conn.data_received(_READ)  # one read, buffered before anyone takes it
        turns, done = [0], asyncio.Event()
        beside = asyncio.create_task(_beside(turns, done))
        await asyncio.sleep(0)
        pieces: list[tuple[int, int]] = []
        received = b""
        async for data in response.chunks(stream=True):
            pieces.append((len(data), turns[0]))
            received += data
        done.set()
        await beside
        assert received == _BURST + _LAST
        return pieces

    pieces = asyncio.run(run())
    sizes = [size for size, _ in pieces]
    assert max(sizes) <= PIECE, sizes
    seen = [turn for _, turn in pieces]
    assert all(later > earlier for earlier, later in itertools.pairwise(seen)), seen


def test_a_whole_answer_is_read_as_it_came() -> None:
    """`read()` (a whole answer, not relayed as it comes) takes what is buffered at once."""

    async def run() -> bytes:
        conn, response, _ = _connection()
        conn.data_received(_READ)
        return await response.read(1 << 20, deadline=asyncio.get_running_loop().time() + 30)

    assert asyncio.run(run()) == _BURST + _LAST


def test_a_piece_ends_after_an_event_within_its_bound() -> None:
    event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    read = event * (4 * PIECE // len(event))

    async def run() -> list[bytes]:
        conn, response, _ = _connection()
        conn.data_received(b"%x\r\n%b\r\n" % (len(read), read))
        pieces = []
        async for data in response.chunks(stream=True):
            pieces.append(data)
            if sum(map(len, pieces)) == len(read):
                break
        return pieces

    pieces = asyncio.run(run())
    assert b"".join(pieces) == read
    assert all(piece.endswith(b"\n\n") for piece in pieces)
    assert all(len(piece) > PIECE - len(event) for piece in pieces[:-1])


def _own_calls(run: Callable[[], object]) -> list[str]:
    """The response's own Python calls while `run()` runs."""
    calls = python_calls(run, by_qualname)
    return [name for name in calls if name.startswith(("UpstreamResponse.", "ReadWait."))]


def test_a_read_within_a_piece_costs_a_stream_s_consumer_no_python_call_more() -> None:
    """A paced stream's every read is within `PIECE`: handed on whole, with no Python call
    more than before reads were cut (issue 16 counts the CPU of each relayed chunk): by
    `chunks(stream=True)` (the sidecar's stream relay, the gateway's first chunk and its
    relay without a direct writer) as by `chunks()`, and by the pump from its buffer."""
    event = b'data: {"a": 1}\n\n'
    read = b"%x\r\n%b\r\n" % (len(event), event)
    loop = asyncio.new_event_loop()
    try:
        taken: dict[bool, list[str]] = {}
        for stream in (False, True):
            conn, response, _ = _connection()
            chunks = response.chunks(stream=stream)
            conn.data_received(read)
            assert loop.run_until_complete(anext(chunks)) == event
            conn.data_received(read)  # the next read, taken as a stream's every read is
            step = anext(chunks)  # (no Python frame of the response's)
            taken[stream] = _own_calls(functools.partial(loop.run_until_complete, step))
            loop.run_until_complete(chunks.aclose())
        assert taken[True] == taken[False], taken

        conn, response, _ = _connection()
        conn.data_received(read + b"0\r\n\r\n")  # buffered before the pump takes it
        got: list[bytes] = []

        def sink(data: bytes) -> bool:
            got.append(data)
            return True

        pumped = _own_calls(lambda: loop.run_until_complete(response.pump(sink, _ready)))
        assert got == [event]
        assert pumped[:5] == [
            "UpstreamResponse.pump",
            "UpstreamResponse.loop",
            "UpstreamResponse._take",
            "UpstreamResponse._ended",
            "UpstreamResponse.release",
        ], pumped
    finally:
        loop.close()
