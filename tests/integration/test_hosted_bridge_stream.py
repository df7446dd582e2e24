"""A chat stream LiteLLM serves through a Responses API (its bridge) holds none of its
text, and relays no usage the provider did not state (gateway/upstream/hosted_stream.py,
`install_stream_bound`).

LiteLLM's Responses stream added every text and tool-argument delta to a string of its
own (`_generated_content`, copied whole at each delta) until the stream ended, to estimate
the usage when the provider's `response.completed` stated none: 1,000 deltas of 8 KiB
held about 17 MB at the peak of the relay, the chat path 2 MB, and a provider's events
are bounded one by one (`max_response_bytes`), not in total. And that estimate reached the
client and the completion record as the provider's usage. Here a scripted provider on a
real socket speaks the Responses API for `openai/o3-pro` (a model LiteLLM bridges).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient
from tests.helpers.gateways import LITELLM_WARNINGS, hosted_backend
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

pytestmark = LITELLM_WARNINGS

DELTAS = 600
DELTA = 16 * 1024  # 9.8 MB of text in all, each event well under the bound
BOUND = 6 * 1024 * 1024
WHERE = {"output_index": 0, "item_id": "msg_1"}
USAGE = {
    "input_tokens": 3,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 10,
}
LONG = b"<an event of a whole delta>"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def event(doc: dict[str, Any], number: int) -> bytes:
    kind: str = doc["type"]
    data = orjson.dumps({**doc, "sequence_number": number})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def response(status: str, usage: dict[str, Any] | None, output: list[Any]) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "o3-pro",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "usage": usage,
    }


def responses_stream(deltas: int, size: int, usage: dict[str, Any] | None) -> Answer:
    """A Responses stream of `deltas` text deltas of `size` characters (3 on the first
    connection, which loads LiteLLM), ended by `response.completed` stating `usage`."""
    message = {"type": "message", "id": "msg_1", "role": "assistant"}
    done = {**message, "status": "completed", "content": [{"type": "output_text", "text": "."}]}

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        count = 3 if post.connection == 0 else deltas
        writer.write(sse_head())
        writer.write(
            event({"type": "response.created", "response": response("in_progress", None, [])}, 0)
        )
        added = {**message, "status": "in_progress", "content": []}
        writer.write(
            event({"type": "response.output_item.added", "output_index": 0, "item": added}, 1)
        )
        for number in range(count):
            delta = f"{number:08d}".ljust(size, "x")  # not repeated: LiteLLM's loop check
            doc = {"type": "response.output_text.delta", **WHERE, "content_index": 0}
            writer.write(event({**doc, "delta": delta}, 2 + number))
            if number % 64 == 0:
                await writer.drain()
        end = count + 2
        writer.write(
            event({"type": "response.output_item.done", "output_index": 0, "item": done}, end)
        )
        completed = response("completed", usage, [done])
        writer.write(event({"type": "response.completed", "response": completed}, end + 1))
        await writer.drain()
        return False

    return answer


def bridged(answer: Answer) -> Iterator[HostedClient]:
    provider = RawBackend(answer).start()
    settings = hosted_backend("h", provider.url + "/v1")
    settings["models"] = [{"name": "m", "provider_model": "openai/o3-pro"}]
    backend = BackendSettings.model_validate(settings)
    try:
        yield HostedClient(
            backend, environ={"HOSTED_KEY": "k"}, timeout_s=60.0, max_answer_bytes=1 << 20
        )
    finally:
        provider.stop()


async def relay(
    hosted: HostedClient, doc: dict[str, Any], *, keep: int = 1 << 20
) -> tuple[list[bytes], dict[str, int] | None]:
    """Relay one stream whole: its events (one longer than `keep` bytes as `LONG`: the
    test holds none of the text either), and the usage recorded."""
    answer = await hosted.send("chat", dict(doc), "m")
    events: list[bytes] = []
    try:
        async for data in answer.chunks():
            events.append(data if len(data) <= keep else LONG)
    finally:
        await answer.aclose()
    return events, answer.usage


@pytest.fixture
def long_stream() -> Iterator[HostedClient]:
    yield from bridged(responses_stream(DELTAS, DELTA, USAGE))


@pytest.fixture
def without_usage() -> Iterator[HostedClient]:
    yield from bridged(responses_stream(50, 4, None))


def test_a_long_bridged_stream_is_relayed_without_keeping_its_text(
    long_stream: HostedClient,
) -> None:
    async def run() -> tuple[int, int, dict[str, int] | None]:
        await relay(long_stream, CHAT)  # LiteLLM loaded, its clients and caches made
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            events, usage = await relay(long_stream, CHAT, keep=DELTA // 2)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            await long_stream.aclose()
        return peak - base, events.count(LONG), usage

    growth, full_events, usage = asyncio.run(run())
    assert full_events == DELTAS  # every delta relayed whole
    assert usage == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}
    assert growth < BOUND, f"the relay held {growth} bytes at its peak"


def test_a_bridged_stream_whose_provider_stated_no_usage_relays_and_records_none(
    without_usage: HostedClient,
) -> None:
    async def run() -> tuple[list[bytes], dict[str, int] | None]:
        try:
            return await relay(without_usage, {**CHAT, "stream_options": {"include_usage": True}})
        finally:
            await without_usage.aclose()

    events, usage = asyncio.run(run())
    assert usage is None  # not LiteLLM's estimate from the text
    assert events[-1] == b"data: [DONE]\n\n"
    assert not any(b'"usage"' in e for e in events), events[-3:]
