"""A hosted provider's stream, scripted byte for byte, in OpenAI's wire format (SSE),
Gemini's (SSE) or Bedrock Converse's (AWS event stream), and what a `HostedClient`
relays of it (`relayed`): the events, and the failure that ended it, if any.

The provider is a raw backend (tests/helpers/raw_backend.py) that answers every request
with the stream whole, then closes the connection.
"""

from __future__ import annotations

import asyncio
import binascii
import json
import struct
from collections.abc import Callable
from typing import Any, Final

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError
from gateway.upstream.openai_wire import Endpoint
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

__all__ = [
    "AWS_ENVIRON",
    "BEDROCK_MODEL",
    "converse_events",
    "converse_stream",
    "gemini_events",
    "openai_events",
    "relayed",
    "sse_stream",
    "text_events",
]

BEDROCK_MODEL: Final = "bedrock/converse/anthropic.claude-3-haiku-20240307-v1:0"
# What botocore signs a Bedrock call with: fixed, no file or profile read.
AWS_ENVIRON: Final = {
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE00",
    "AWS_SECRET_ACCESS_KEY": "example-secret-access-key",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_CONFIG_FILE": "/dev/null",
}
_CHUNK: Final = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
_USAGE: Final = {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}


def openai_events(reason: str | None) -> list[dict[str, Any]]:
    """A chat stream on OpenAI's wire: a delta, then a chunk ending with `reason`."""
    delta = {"role": "assistant", "content": "half an ans"}
    return [
        {**_CHUNK, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]},
    ]


def text_events(reason: str | None) -> list[dict[str, Any]]:
    """A text completion stream on OpenAI's wire: text, then a chunk ending with `reason`."""
    chunk = {**_CHUNK, "object": "text_completion"}
    return [
        {**chunk, "choices": [{"index": 0, "text": "half an ans", "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "text": "", "finish_reason": reason}]},
    ]


def gemini_events(reason: str | None) -> list[dict[str, Any]]:
    """A Gemini stream: two chunks of text, the second with `finishReason` `reason`
    (none when None)."""
    last: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": " ans"}]}}
    if reason is not None:
        last["finishReason"] = reason
    first = {"content": {"role": "model", "parts": [{"text": "half an"}]}}
    return [
        {"candidates": [first], "usageMetadata": _USAGE},
        {"candidates": [last], "usageMetadata": _USAGE},
    ]


def converse_events(reason: str | None) -> list[tuple[str, dict[str, Any]]]:
    """A Bedrock ConverseStream: text, then `messageStop` with `stopReason` `reason`
    (no `messageStop` when None), then its metadata."""
    events: list[tuple[str, dict[str, Any]]] = [
        ("messageStart", {"role": "assistant"}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "half an ans"}}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
    ]
    if reason is not None:
        events.append(("messageStop", {"stopReason": reason}))
    usage = {"inputTokens": 1, "outputTokens": 3, "totalTokens": 4}
    events.append(("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))
    return events


def sse_stream(events: list[dict[str, Any]], *, done: bool = True) -> Answer:
    """An answer that writes `events` as SSE, then `data: [DONE]` when `done`."""
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return _writes(sse_head() + body + (b"data: [DONE]\n\n" if done else b""))


def converse_stream(events: list[tuple[str, dict[str, Any]]]) -> Answer:
    """An answer that writes `events` ((event type, payload)) as an AWS event stream."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/vnd.amazon.eventstream\r\n"
    body = b"".join(_event_message(kind, payload) for kind, payload in events)
    return _writes(head + b"connection: close\r\n\r\n" + body)


def _event_message(kind: str, payload: dict[str, Any]) -> bytes:
    """One message of the AWS event stream encoding: a prelude (total and headers
    lengths, its CRC32), string headers, the JSON payload, the message's CRC32."""
    headers = b""
    for name, value in ((":event-type", kind), (":content-type", "application/json")):
        headers += _string_header(name, value)
    headers += _string_header(":message-type", "event")
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(headers) + len(body) + 4, len(headers))
    message = prelude + struct.pack(">I", binascii.crc32(prelude)) + headers + body
    return message + struct.pack(">I", binascii.crc32(message))


def _string_header(name: str, value: str) -> bytes:
    encoded = value.encode()
    return bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(encoded)) + encoded


def _writes(data: bytes) -> Answer:
    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(data)
        await writer.drain()
        return False

    return answer


def relayed(
    start_raw: Callable[[Answer], RawBackend],
    answer: Answer,
    provider: str,
    provider_model: str,
    doc: dict[str, Any] | None = None,
    endpoint: Endpoint = "chat",
) -> tuple[list[bytes], HostedError | None]:
    """The events a `HostedClient` for `provider_model` relays of `answer`'s stream (for
    `doc` at `endpoint`), and the `HostedError` that ended it (None when it ended with
    `[DONE]`)."""
    raw = start_raw(answer)
    aws = provider == "aws"
    backend = BackendSettings.model_validate(
        {
            "id": "h",
            "kind": "hosted",
            "provider": provider,
            "base_url": raw.url if provider in ("aws", "gemini") else f"{raw.url}/v1",
            "models": [{"name": "m", "provider_model": provider_model}],
            "region": "eu-west-1" if aws else "eu",
            "owner": provider,
            **({} if aws else {"api_key_env": "KEY"}),
        }
    )
    client = HostedClient(backend, environ={"KEY": "k"}, timeout_s=30, max_answer_bytes=1 << 20)
    ask = doc or {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    return client_relayed(client, endpoint, ask)


def client_relayed(
    client: HostedClient, endpoint: Endpoint, ask: dict[str, Any]
) -> tuple[list[bytes], HostedError | None]:
    """What `client` relays of its answer to `ask` (closed after): a stream's events, or a
    whole answer's body as one item; and the `HostedError` that ended it, if any."""

    async def read() -> tuple[list[bytes], HostedError | None]:
        events: list[bytes] = []
        try:
            response = await client.send(endpoint, ask, "m")
            if not ask.get("stream"):
                return [response.body or b""], None
            async for event in response.chunks():
                events.append(event)
        except HostedError as exc:
            return events, exc
        finally:
            await client.aclose()
        return events, None

    return asyncio.run(read())
