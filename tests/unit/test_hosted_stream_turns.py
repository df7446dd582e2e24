"""A hosted stream gives the event loop a turn per chunk (gateway/upstream/hosted_stream.py).

LiteLLM and the OpenAI SDK parse every SSE event already read without awaiting anything,
at about 2 ms each: a provider sending 10,000 tiny events in one burst held a real
gateway's event loop 14 s (every other request waited). Here the source is a stream
whose chunks are all ready at once, as those were; a task beside it must get turns
while it is relayed, not only after.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gateway.upstream.hosted_stream import ProviderStream
from tests.helpers.loop_turns import with_turns_beside

CHUNKS = 200


async def _ready_chunks() -> AsyncIterator[dict[str, Any]]:
    for number in range(CHUNKS):  # nothing awaited: all of it read already
        last = number == CHUNKS - 1
        choice = {"index": 0, "delta": {"content": "x"}, "finish_reason": "stop" if last else None}
        yield {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}


def test_a_burst_of_chunks_leaves_the_event_loop_turns_between_them() -> None:
    async def relay() -> int:
        stream = ProviderStream(_ready_chunks(), None, "chat", False, "openai")
        relayed = 0
        async for data, _ in stream.events():
            relayed += data is not None
        return relayed

    relayed, turns = asyncio.run(with_turns_beside(relay()))
    assert relayed == CHUNKS + 1  # every chunk and [DONE]
    assert turns >= CHUNKS  # a turn per chunk, not one for the whole burst
