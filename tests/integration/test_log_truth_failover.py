"""What the log says when an answer fails before the client saw a byte of it, or is cut
short by its provider: a private stream that ends before its first byte is failed over
like a refused connection (or answered with an OpenAI error, never a 200), a hosted
stream its provider closed before finishing is recorded (and shown) as broken off, and
token counts LiteLLM made up for a provider that reported none are not the record's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import commit
from gateway.serving import ServerThread
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    backend,
    hosted_backend,
    logged_gateway,
)
from tests.helpers.log_truth import (
    CHAT,
    DONE,
    EVENT,
    ORIGIN,
    hosted_gateway,
    salt_of,
    sse_events,
    stream_receipt,
)
from tests.helpers.provenance import completion_record, records
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer, sse_head
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS  # some of these tests stream from a hosted backend

_ANTHROPIC_KEY = "sk-ant-test"
_PROVIDER_CHUNK = (
    b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"}}]}\n\n'
)
# How a backend can answer 200 to a stream request and end it with no body byte.
_EMPTY_STREAMS = {
    "close": sse_head(),
    "chunked": sse_head(b"transfer-encoding: chunked\r\n") + b"0\r\n\r\n",
    "length": sse_head(b"content-length: 0\r\n"),
}


@pytest.mark.parametrize("empty", list(_EMPTY_STREAMS.values()), ids=list(_EMPTY_STREAMS))
def test_a_stream_that_ends_before_its_first_byte_fails_over_to_the_next_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    empty: bytes,
) -> None:
    """The first backend tried answers 200 and ends the stream with no body: nothing
    reached the client, so the other backend serves it, as after a refused connection;
    the records say so (a failed attempt, then the one that served)."""
    posts: list[str] = []  # the backends asked, in order

    def answer(name: str) -> Answer:
        async def first_is_empty(writer: asyncio.StreamWriter, _post: Post) -> bool:
            posts.append(name)
            writer.write(empty if len(posts) == 1 else sse_head() + EVENT + DONE)
            await writer.drain()
            return False

        return first_is_empty

    backends = [backend(n, start_raw(answer(n)).url, "m") for n in ("a", "b")]
    gateway = logged_gateway(start_gateway, tmp_path, backends, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200
    seen = response.content.split(b": owngate-receipt ")[0]
    assert seen == EVENT + DONE
    request_id, salt = salt_of(stream_receipt(response.content))
    found: list[dict[str, Any]] = []

    def both_covered() -> bool:
        found[:] = [r for r in records(tmp_path / "log") if r["request_id"] == request_id]
        return [r["type"] for r in found].count("completion") == 2

    until(both_covered, "both completion records signed")
    assert [r["type"] for r in found] == ["dispatch", "completion"] * 2
    failed, served = found[1], found[3]
    assert failed["status"] == 503 and failed["response_commitment"] is None
    assert served["status"] == 200
    assert served["response_commitment"] == commit("response", salt, seen)
    assert [found[0]["backend"]["id"], found[2]["backend"]["id"]] == posts  # one each
    assert sorted(posts) == ["a", "b"]


def test_a_lone_backends_stream_that_ends_before_its_first_byte_gets_an_openai_503(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """No other backend the policy admits (the configured hosted one it does not): the
    client gets a 503 error object, not a 200 stream holding an error event, and the
    excluded provider is never asked."""

    async def empty(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head())
        await writer.drain()
        return False

    raw, provider = start_raw(empty), start_raw(empty)
    backends = [backend("gpu", raw.url, "m"), hosted_backend("hosted", f"{provider.url}/v1", "m")]
    gateway = logged_gateway(
        start_gateway, tmp_path, backends, ORIGIN, environ={"HOSTED_KEY": "sk-test"}
    )
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "backend_unavailable"
    request_id = response.headers["x-request-id"]
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 503 and record["response_commitment"] is None
    assert len(raw.posts) == 1 and provider.posts == []


def _anthropic_gateway(start_gateway: Callable[..., Gateway], tmp_path: Path, url: str) -> Gateway:
    """A gateway whose model `m` only the Anthropic provider at `url` serves."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    anthropic = hosted_backend(
        "hosted",
        url,
        provider="anthropic",
        models=[{"name": "m", "provider_model": "anthropic/claude-mock-1"}],
    )
    return logged_gateway(
        start_gateway,
        tmp_path,
        [anthropic],
        ORIGIN,
        environ={"HOSTED_KEY": _ANTHROPIC_KEY},
        policy={"paths": [str(tmp_path / "policies")]},
    )


def _broken_off(content: bytes) -> bytes:
    """What a stream ended by the gateway's error event showed before it (the client's
    events), checking that it ended so: the error event, its receipt, no `[DONE]`."""
    seen, error, _ = content.partition(b'data: {"error"')
    assert error, content
    assert b"[DONE]" not in content
    events = sse_events(content)
    assert json.loads(events[-1].removeprefix(b"data: "))["error"]["code"] == "upstream_error"
    return seen


def test_a_hosted_stream_its_provider_closed_early_is_recorded_as_broken_off(
    start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """Anthropic's stream ends (cleanly framed) after two text deltas, without its
    `message_stop`: LiteLLM makes up a `finish_reason: "stop"` chunk for it, which would
    tell the client and the record (200) that the answer was complete. The client gets
    the two deltas and an error event instead, and the record 502 and those deltas."""
    mock = AnthropicMock(api_key=_ANTHROPIC_KEY, reply="one two three four five")
    mock.cut_after = 2
    with ServerThread(mock) as provider:
        gateway = _anthropic_gateway(start_gateway, tmp_path, provider.url)
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=60
        )
    assert response.status_code == 200  # the headers went out with the first delta
    seen = _broken_off(response.content)
    assert b'"content":"one"' in seen and b'"content":" two"' in seen
    assert b'"finish_reason":"stop"' not in seen
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (502, "upstream_error")
    assert record["response_commitment"] == commit("response", salt, seen)


def test_an_openai_shaped_stream_closed_before_it_finished_is_recorded_as_broken_off(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The provider's stream ends with its connection after one chunk: no finish reason,
    no `[DONE]`. The client is not told it finished, nor is the record."""

    async def closes(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + _PROVIDER_CHUNK)
        await writer.drain()
        return False

    raw = start_raw(closes)
    gateway = hosted_gateway(start_gateway, tmp_path, f"{raw.url}/v1", "m")
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=60
    )
    seen = _broken_off(response.content)
    assert b'"content":"hi"' in seen and b'"finish_reason":"stop"' not in seen
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (502, "upstream_error")
    assert record["response_commitment"] == commit("response", salt, seen)


def test_a_hosted_stream_closed_before_its_first_chunk_gets_an_openai_503(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The provider answers 200 and closes the stream with nothing in it: nothing reached
    the client, so it is a failed attempt (here the only one: 503), never a 200 whose
    made-up chunk says the answer was complete."""

    async def empty(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head())
        await writer.drain()
        return False

    raw = start_raw(empty)
    gateway = hosted_gateway(start_gateway, tmp_path, f"{raw.url}/v1", "m")
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "backend_unavailable"
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 503 and record["response_commitment"] is None


@pytest.mark.parametrize("asks_usage", [False, True], ids=["plain", "asks-usage"])
def test_usage_litellm_counted_itself_is_neither_recorded_nor_sent_as_the_providers(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    asks_usage: bool,
) -> None:
    """The provider finishes its stream but reports no usage: LiteLLM ends the stream
    with a usage chunk of its own counting. The record says no usage was reported (it
    said LiteLLM's estimate, as the provider's), and a client that asked for usage gets
    no chunk claiming it."""
    finish = _PROVIDER_CHUNK.replace(
        b'"delta":{"role":"assistant","content":"hi"}}', b'"delta":{},"finish_reason":"stop"}'
    )

    async def no_usage(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + _PROVIDER_CHUNK + finish + DONE)
        await writer.drain()
        return False

    raw = start_raw(no_usage)
    gateway = hosted_gateway(start_gateway, tmp_path, f"{raw.url}/v1", "m")
    ask = {**CHAT, "stream_options": {"include_usage": True}} if asks_usage else CHAT
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=60
    )
    seen = response.content.split(b": owngate-receipt ")[0]
    assert seen.endswith(DONE) and b'"usage"' not in seen, seen
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 200 and record["usage"] is None
    assert record["response_commitment"] == commit("response", salt, seen)


def test_a_whole_hosted_answer_without_usage_is_not_recorded_or_sent_with_zero_usage(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The provider's answer has no `usage`: LiteLLM gives it zero counts, which the
    client got and the record kept as the provider's (and the tenant's budget was
    charged nothing for it). Neither says usage now: the record's is null."""
    answer = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
        }
    ).encode()
    no_usage = json_answer(answer)

    raw = start_raw(no_usage)
    gateway = hosted_gateway(start_gateway, tmp_path, f"{raw.url}/v1", "m")
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, "stream": False},
        headers=gateway.headers,
        timeout=60,
    )
    assert response.status_code == 200, response.content
    assert "usage" not in response.json()
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["usage"] is None


@pytest.mark.parametrize(
    "junk",
    [b"this is not an event stream\n\n", b"data: not json\n\n", b"data: {}\n\ndata: [DONE]\n\n"],
    ids=["text", "not-json", "no-choices"],
)
def test_a_hosted_stream_of_junk_is_never_recorded_as_a_complete_answer(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    junk: bytes,
) -> None:
    """The provider answers 200 with an event stream holding no chunk of an answer: the
    client never gets a 200 whose stream ends as if finished, and the record never says
    the provider served it."""

    async def nonsense(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + junk)
        await writer.drain()
        return False

    raw = start_raw(nonsense)
    gateway = hosted_gateway(start_gateway, tmp_path, f"{raw.url}/v1", "m")
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers=gateway.headers,
        timeout=60,
    )
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    if response.status_code == 200:  # a stream was started: it must end as broken off
        assert b"data: [DONE]" not in response.content, response.content
        assert b'"finish_reason":"stop"' not in response.content, response.content
        assert record["status"] >= 500, record
    else:
        assert response.status_code >= 500, response.content
        assert record["status"] == response.status_code
