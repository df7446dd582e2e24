"""What LiteLLM's Anthropic stream parser holds while a long thinking block and a huge
tool-call argument are relayed does not grow with them (gateway/upstream/
anthropic_deltas.py), and what the client gets is unchanged.

The parser kept every thinking, signature and tool-argument delta of a content block
(about 1 KB each besides the text) and all the thinking text until the stream ended.
Here a scripted Anthropic provider on a real socket streams DELTAS thinking deltas of
PIECE bytes, a signature, then a tool call whose arguments come in DELTAS pieces; the
Python memory allocated at the peak of the relay (tracemalloc, after a first stream
loaded LiteLLM) must stay under BOUND (the old code held about 2 KB an event, 8 MB
here). The thinking text, the signature, the tool call's name, id and arguments, the
finish reason and the provider's usage must come out whole and exact; the test keeps
digests of them, not the text (what it kept would count against the bound).

A whole (non-streaming) answer's usage relays the reasoning tokens Anthropic counted, and
none where it counted none: LiteLLM estimated them from the thinking text as if Anthropic
had counted them.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient
from tests.helpers.gateways import LITELLM_WARNINGS, anthropic_backend
from tests.helpers.raw_backend import Post, RawBackend, json_answer, sse_head

pytestmark = LITELLM_WARNINGS

DELTAS = 2000
WARM_UP = 5  # deltas of each kind in the first stream, which loads LiteLLM
PIECE = 1024
BOUND = 3 * 1024 * 1024
OUTPUT_TOKENS = 7777
ENV = {"MOCK_ANTHROPIC_KEY": "k"}
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}
SIGNATURE = "sig-" + "s" * 200


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def thought(number: int) -> str:
    return f"{number:06d}" + "t" * (PIECE - 6)


def argument_piece(number: int, deltas: int) -> str:
    """The tool call's arguments, `{"text": "aaaa...", "n": 1}`, in `deltas` pieces."""
    if number == 0:
        return '{"text": "'
    if number == deltas - 1:
        return '", "n": 1}'
    return f"{number:06d}" + "a" * (PIECE - 6)


def delta(index: int, body: dict[str, Any]) -> bytes:
    return event(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}
    )


def block(index: int, content: dict[str, Any] | None) -> bytes:
    """A content block's start (`content`), or its stop (None)."""
    if content is None:
        return event("content_block_stop", {"type": "content_block_stop", "index": index})
    start = {"type": "content_block_start", "index": index, "content_block": content}
    return event("content_block_start", start)


async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
    deltas = WARM_UP if post.connection == 0 else DELTAS
    writer.write(sse_head())
    message: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant"}
    message |= {"model": "claude-mock-1", "content": []}
    message["usage"] = {"input_tokens": 3, "output_tokens": 1}
    writer.write(event("message_start", {"type": "message_start", "message": message}))
    writer.write(block(0, {"type": "thinking", "thinking": ""}))
    for number in range(deltas):
        writer.write(delta(0, {"type": "thinking_delta", "thinking": thought(number)}))
        if number % 64 == 0:
            await writer.drain()
    writer.write(delta(0, {"type": "signature_delta", "signature": SIGNATURE}))
    writer.write(block(0, None))
    writer.write(block(1, {"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}}))
    for number in range(deltas):
        piece = argument_piece(number, deltas)
        writer.write(delta(1, {"type": "input_json_delta", "partial_json": piece}))
        if number % 64 == 0:
            await writer.drain()
    writer.write(block(1, None))
    end = {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}}
    writer.write(event("message_delta", end | {"usage": {"output_tokens": OUTPUT_TOKENS}}))
    writer.write(event("message_stop", {"type": "message_stop"}))
    await writer.drain()
    return False


@dataclass
class Seen:
    """Digests of what the client got, not the text."""

    thinking: Any = field(default_factory=hashlib.sha256)
    arguments: Any = field(default_factory=hashlib.sha256)
    signatures: list[str] = field(default_factory=list)
    tool_calls: list[tuple[str | None, str | None, int | None]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    usage: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    def read(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if line == b"data: [DONE]":
                self.done = True
            elif line.startswith(b"data: "):
                self.chunk(orjson.loads(line[6:]))

    def chunk(self, doc: dict[str, Any]) -> None:
        if "usage" in doc:
            self.usage.append(doc["usage"])
        for choice in doc.get("choices") or ():
            if choice.get("finish_reason"):
                self.finish.append(choice["finish_reason"])
            got = choice.get("delta") or {}
            self.thinking.update((got.get("reasoning_content") or "").encode())
            for block in got.get("thinking_blocks") or ():
                if block.get("signature"):
                    self.signatures.append(block["signature"])
            for call in got.get("tool_calls") or ():
                function = call.get("function") or {}
                self.arguments.update((function.get("arguments") or "").encode())
                if call.get("id") or function.get("name"):
                    self.tool_calls.append(
                        (call.get("id"), function.get("name"), call.get("index"))
                    )


def expected_digests(deltas: int) -> tuple[str, str]:
    thinking = hashlib.sha256("".join(thought(n) for n in range(deltas)).encode())
    arguments = hashlib.sha256("".join(argument_piece(n, deltas) for n in range(deltas)).encode())
    return thinking.hexdigest(), arguments.hexdigest()


@pytest.fixture
def hosted() -> Iterator[HostedClient]:
    provider = RawBackend(answer).start()
    backend = BackendSettings.model_validate(anthropic_backend("h", provider.url))
    try:
        yield HostedClient(backend, environ=ENV, timeout_s=60.0, max_answer_bytes=1 << 20)
    finally:
        provider.stop()


async def relay(hosted: HostedClient) -> tuple[Seen, dict[str, int] | None]:
    response = await hosted.send("chat", dict(CHAT), "m")
    seen = Seen()
    try:
        async for data in response.chunks():
            seen.read(data)
    finally:
        await response.aclose()
    return seen, response.usage


def test_long_thinking_and_huge_tool_arguments_are_relayed_whole_without_being_kept(
    hosted: HostedClient,
) -> None:
    async def run() -> tuple[int, Seen, dict[str, int] | None, Seen]:
        first, _ = await relay(hosted)  # LiteLLM loaded, its clients and caches made
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            seen, usage = await relay(hosted)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            await hosted.aclose()
        return peak - base, seen, usage, first

    growth, seen, usage, first = asyncio.run(run())
    for got, deltas in ((first, WARM_UP), (seen, DELTAS)):
        thinking, arguments = expected_digests(deltas)
        assert got.thinking.hexdigest() == thinking
        assert got.arguments.hexdigest() == arguments
        assert got.signatures == [SIGNATURE]
        assert got.tool_calls == [("toolu_1", "write", 0)]
        assert got.finish == ["tool_calls"] and got.done
    recorded = {
        "prompt_tokens": 3,
        "completion_tokens": OUTPUT_TOKENS,
        "total_tokens": OUTPUT_TOKENS + 3,
    }
    assert usage == recorded  # the provider's counts, recorded
    assert seen.usage == [recorded]  # and relayed: no estimate of reasoning tokens
    assert growth < BOUND, f"the relay held {growth} bytes at its peak"


THOUGHT = "Let me think about this carefully. " * 20
ANSWER: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-mock-1",
    "content": [
        {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
        {"type": "text", "text": "Hi"},
    ],
    "stop_reason": "end_turn",
    "stop_sequence": None,
}


@pytest.mark.parametrize(
    ("reported", "relayed"),
    [
        ({}, None),  # Anthropic counted no thinking tokens apart: none is made up
        ({"output_tokens_details": {"thinking_tokens": 321}}, {"reasoning_tokens": 321}),
    ],
)
def test_a_whole_answer_relays_the_reasoning_tokens_the_provider_counted_or_none(
    reported: dict[str, Any], relayed: dict[str, int] | None
) -> None:
    # LiteLLM estimated them from the thinking text (141 here) as if Anthropic had counted.
    usage = {"input_tokens": 3, "output_tokens": 500, **reported}
    provider = RawBackend(json_answer(orjson.dumps(ANSWER | {"usage": usage}))).start()
    backend = BackendSettings.model_validate(anthropic_backend("h", provider.url))

    async def run() -> tuple[dict[str, Any], dict[str, int] | None]:
        hosted = HostedClient(backend, environ=ENV, timeout_s=30.0, max_answer_bytes=1 << 20)
        try:
            response = await hosted.send("chat", {**CHAT, "stream": False}, "m")
            return orjson.loads(response.body or b"null"), response.usage
        finally:
            await hosted.aclose()

    try:
        body, recorded = asyncio.run(run())
    finally:
        provider.stop()
    counts = {"prompt_tokens": 3, "completion_tokens": 500, "total_tokens": 503}
    assert recorded == counts
    assert {k: body["usage"][k] for k in counts} == counts
    assert body["usage"].get("completion_tokens_details") == relayed
    assert body["choices"][0]["message"]["reasoning_content"] == THOUGHT  # relayed as sent
