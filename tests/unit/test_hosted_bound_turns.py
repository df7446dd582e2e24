"""A hosted stream's reads are handed to LiteLLM and the OpenAI SDK in pieces, a turn of
the event loop before each (gateway/upstream/hosted_bound.py): they parse every event of
what they are given without awaiting anything, and LiteLLM yields nothing for an event
with nothing to relay, so a burst of empty-delta events held the loop (3,000: 470 ms)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from gateway.upstream.hosted_bound import _bounded_stream
from gateway.upstream.hosted_transport import Outbound
from tests.helpers.loop_turns import with_turns_beside

EVENT = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"delta":{}}]}\n\n'
READ = EVENT * (65536 // len(EVENT))  # one read of a burst, as the socket gives it


class _Ready(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield READ  # nothing awaited: read already

    async def aclose(self) -> None:
        return None


def _turns_while_reading(whole: bool) -> tuple[bytes, int]:
    async def read() -> bytes:
        limit = 1 << 20
        pieces = _bounded_stream("httpx", _Ready(), limit, whole, Outbound(limit))
        return b"".join([c async for c in pieces])

    return asyncio.run(with_turns_beside(read()))


def test_a_stream_read_is_handed_on_in_pieces_with_turns_between() -> None:
    got, turns = _turns_while_reading(whole=False)
    assert got == READ
    assert turns >= len(READ) // 8192  # a turn per piece (4 KiB), not one for the whole read


def test_a_whole_answer_is_read_as_it_comes() -> None:
    got, turns = _turns_while_reading(whole=True)
    assert got == READ and turns <= 1  # no piecing for `aread`: no parse in between
