"""What a hosted stream holds while it is relayed does not grow with its length
(gateway/upstream/hosted_stream.py, `keep_little`).

LiteLLM's stream wrapper kept every chunk it returned (about 4 KB each) and the text of
all of them until the stream ended: 100,000 tiny events grew the gateway by 570 MB, and
a client gets the same by asking a hosted model for long answers on several streams.
Here a scripted provider on a real socket streams EVENTS one-character events, in
OpenAI's (chat and text completions) and Anthropic's wire formats, and the Python memory
allocated at the peak of the relay (tracemalloc, after a first stream loaded LiteLLM and
its caches) must stay under BOUND: the old code took about 3.7 KB an event (18 MB
here). The usage the provider reported must still come out whole.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient
from gateway.upstream.openai_wire import Endpoint
from tests.helpers.gateways import LITELLM_WARNINGS, anthropic_backend, hosted_backend
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

pytestmark = LITELLM_WARNINGS

EVENTS = 5000
WARM_UP = 20  # events of the first stream, which loads LiteLLM
BOUND = 6 * 1024 * 1024
ENV = {"HOSTED_KEY": "k", "MOCK_ANTHROPIC_KEY": "k"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
OPENAI_CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]%s}\n\n'
)
TEXT = {"model": "m", "prompt": "hi", "stream": True}
TEXT_CHUNK = (
    b'data: {"id":"c","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":"x","finish_reason":null,"logprobs":null}]}\n\n'
)
TEXT_END = (
    b'data: {"id":"c","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":"","finish_reason":"stop","logprobs":null}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n'
)
OPENAI_END = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n'
)
ANTHROPIC_HEAD = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
    b'"type":"message","role":"assistant","model":"claude-mock-1","content":[],'
    b'"stop_reason":null,"usage":{"input_tokens":3,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
ANTHROPIC_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"x"}}\n\n'
)
ANTHROPIC_END = (
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":%d}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def streaming(head: bytes, event: Callable[[int], bytes], tail: Callable[[int], bytes]) -> Answer:
    """An SSE answer of `head`, EVENTS `event(n)` (WARM_UP on the first connection) and
    `tail(events)`, then the connection closed."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        events = WARM_UP if post.connection == 0 else EVENTS
        writer.write(sse_head() + head)
        for number in range(events):
            writer.write(event(number))
            if number % 256 == 0:
                await writer.drain()
        writer.write(tail(events))
        await writer.drain()
        return False

    return answer


def openai_usage_every(number: int) -> bytes:
    """A chunk with the counts so far, as Gemini sends them: one usage chunk an event."""
    usage = b',"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}'
    return OPENAI_CHUNK % (usage % (number + 1, number + 4))


def openai_end(events: int) -> bytes:
    return OPENAI_END % (events, events + 3)


def openai(url: str) -> dict[str, Any]:
    return hosted_backend("h", url + "/v1", "m")


# (the backend at the provider's URL, the provider's answer, the endpoint, the request)
PROVIDERS: dict[str, tuple[Callable[[str], dict[str, Any]], Answer, Endpoint, dict[str, Any]]] = {
    "openai": (openai, streaming(b"", lambda _: OPENAI_CHUNK % b"", openai_end), "chat", CHAT),
    "openai-usage-on-every-chunk": (
        openai,
        streaming(b"", openai_usage_every, openai_end),
        "chat",
        CHAT,
    ),
    # LiteLLM makes a text completion's stream wrapper inside a generator of its own
    "openai-text-completion": (
        openai,
        streaming(b"", lambda _: TEXT_CHUNK, lambda events: TEXT_END % (events, events + 3)),
        "completions",
        TEXT,
    ),
    "anthropic": (
        lambda url: anthropic_backend("h", url),
        streaming(ANTHROPIC_HEAD, lambda _: ANTHROPIC_DELTA, lambda events: ANTHROPIC_END % events),
        "chat",
        CHAT,
    ),
}


Client = tuple[HostedClient, Endpoint, dict[str, Any]]


@pytest.fixture(params=sorted(PROVIDERS))
def client(request: pytest.FixtureRequest) -> Iterator[Client]:
    settings, answer, endpoint, doc = PROVIDERS[request.param]
    provider = RawBackend(answer).start()
    backend = BackendSettings.model_validate(settings(provider.url))
    try:
        hosted = HostedClient(backend, environ=ENV, timeout_s=30.0, max_answer_bytes=1 << 20)
        yield hosted, endpoint, doc
    finally:
        provider.stop()


async def relay(client: Client) -> tuple[int, dict[str, int] | None]:
    """Relay one stream whole: how many events, and the usage recorded."""
    hosted, endpoint, doc = client
    response = await hosted.send(endpoint, dict(doc), "m")
    events = 0
    try:
        async for _ in response.chunks():
            events += 1
    finally:
        await response.aclose()
    return events, response.usage


def test_a_long_stream_is_relayed_without_keeping_its_chunks(client: Client) -> None:
    async def run() -> tuple[int, int, dict[str, int] | None]:
        await relay(client)  # LiteLLM loaded, its clients and caches made
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            events, usage = await relay(client)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            await client[0].aclose()
        return peak - base, events, usage

    growth, events, usage = asyncio.run(run())
    assert events >= EVENTS + 1  # every text event and [DONE]
    assert usage == {"prompt_tokens": 3, "completion_tokens": EVENTS, "total_tokens": EVENTS + 3}
    assert growth < BOUND, f"the relay held {growth} bytes at its peak"
