"""A hosted provider's faults are survived, not hidden: nothing leaks, nothing hangs, and the
client (and the signed record) get a timeout's 504 as from a private backend.

- A text completion of a model LiteLLM serves through its Responses bridge
  (`openai/responses/<model>`) reached LiteLLM's text-completion handler without the
  gateway's client, and the handler built a new OpenAI client (aiohttp session, connector)
  for each call and never closed it: a provider answering 500 on a kept-alive connection
  left one open descriptor per request in `owngate serve` until the garbage collector found
  it (gateway/upstream/text_client.py).
- A stream whose provider sent its role-only first chunk and then only SSE comments held
  the client, and its slot, forever: LiteLLM drops comments, and each one restarted its
  per-read timeout. Each wait for the next chunk is now bounded by `limits.read_timeout_s`.
- A hosted timeout answered 503 `backend_unavailable`, a private one 504 `upstream_timeout`
  (what docs/api.md says of both).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS, TENANT_KEY, Gateway
from tests.helpers.log_truth import hosted_gateway, sse_events
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import ERROR_BODY, Answer, Post, RawBackend, json_answer, sse_head

pytestmark = LITELLM_WARNINGS

HEADERS = {"authorization": f"Bearer {TENANT_KEY}"}
FAILING = 20  # requests answered 500


async def _error_kept_alive(writer: asyncio.StreamWriter, _post: Post) -> bool:
    """A provider's 500, the connection kept open for the next request."""
    head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
    writer.write(head + b"content-length: %d\r\n\r\n" % len(ERROR_BODY) + ERROR_BODY)
    await writer.drain()
    return True


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def bridged(start_raw: Callable[[Answer], RawBackend], tmp_path: Path) -> Iterator[Any]:
    provider = start_raw(_error_kept_alive)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning"},
        "policy": {"paths": ["policies"]},
        "backends": [
            {
                "id": "hosted",
                "kind": "hosted",
                "provider": "openai",
                "base_url": f"{provider.url}/v1",
                "api_key_env": "HOSTED_KEY",
                "owner": "provider",
                "region": "eu-west-1",
                "retention": {"days": 0, "zero_data_retention": True},
                "models": [{"name": "m", "provider_model": "openai/responses/gpt-4o"}],
                "breaker": {"failure_threshold": 1000},  # every request reaches the provider
            }
        ],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}],
    }
    gateway = GatewayProcess(config, tmp_path, env={"HOSTED_KEY": "sk-bridge-0123456789"})
    try:
        yield gateway.start(), provider
    finally:
        gateway.stop()


def test_failing_bridged_text_completions_leave_no_descriptor_open(bridged: Any) -> None:
    gateway, provider = bridged
    assert gateway.proc is not None

    def fail_once() -> None:
        response = httpx.post(
            f"{gateway.url}/v1/completions",
            json={"model": "m", "prompt": "hi"},
            headers=HEADERS,
            timeout=120,  # the first hosted request imports LiteLLM
        )
        assert response.status_code == 503, response.text

    fail_once()  # LiteLLM loaded, the gateway's client and its connection made
    before = _descriptors(gateway.proc.pid)
    for _ in range(FAILING):
        fail_once()
    assert len(provider.posts) == FAILING + 1
    assert provider.posts[-1].head.startswith(b"POST /v1/completions ")  # bridged, not chat
    # One kept-alive connection serves them all; before, every request opened its own and
    # left it open (with its session) until a garbage collection.
    assert provider.connections <= 2, provider.connections
    assert _descriptors(gateway.proc.pid) <= before + 2, (before, gateway.output())


CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
ROLE_ONLY = orjson.dumps(
    {**CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
)
PINGS = 400  # at 50 ms: 20 s of comments, far past the read timeout


@pytest.mark.parametrize("keepalive", [b": ping\n\n", b"\n", b":\n\n"])
def test_a_stream_of_only_comments_ends_at_the_read_timeout(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    keepalive: bytes,
) -> None:
    written = [0]

    async def quiet(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + b"data: " + ROLE_ONLY + b"\n\n")
        await writer.drain()
        for _ in range(PINGS):  # the fault: bytes, never an event, for as long as it likes
            await asyncio.sleep(0.05)
            writer.write(keepalive)
            await writer.drain()
            written[0] += 1
        return False

    provider = start_raw(quiet)
    gateway = hosted_gateway(
        start_gateway, tmp_path, f"{provider.url}/v1", "m", limits={"read_timeout_s": 1.0}
    )
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers=HEADERS,
        timeout=120,
    )
    events = sse_events(response.content)
    assert orjson.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"
    error = orjson.loads(events[-1][6:])["error"]
    assert error["code"] == "upstream_timeout", events
    assert b"[DONE]" not in response.content
    assert provider.finished.wait(30)
    assert written[0] < PINGS  # the gateway hung up on the provider: its slot is free
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 504, record  # what the client saw: a timeout, cut short
    assert record["error"] == "upstream_timeout", record


def test_a_hosted_timeout_is_a_504_as_a_private_one_is(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    release = threading.Event()
    provider = start_raw(json_answer(ERROR_BODY, b"500 Internal Server Error", release))
    gateway = hosted_gateway(
        start_gateway, tmp_path, f"{provider.url}/v1", "m", limits={"first_byte_timeout_s": 0.5}
    )
    try:
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers=HEADERS,
            timeout=120,
        )
    finally:
        release.set()
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "upstream_timeout"
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 504, record  # the signed record says what the client got


def _answer(usage: dict[str, Any]) -> bytes:
    message = {"role": "assistant", "content": "hello"}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    doc = {"id": "chatcmpl-9", "object": "chat.completion", "created": 1, "model": "m"}
    return json.dumps({**doc, "choices": [choice], "usage": usage}).encode()  # 2**64: not orjson


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -5, "completion_tokens": -1000000, "total_tokens": -1000005},
        {"prompt_tokens": 3, "completion_tokens": 2**64, "total_tokens": 2**64 + 3},
        {"prompt_tokens": 3, "completion_tokens": 2**53 + 1, "total_tokens": 4},
        {
            "prompt_tokens": 3,
            "completion_tokens": 1,
            "total_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": -7},
        },
    ],
    ids=["negative", "past-64-bits", "past-2**53", "negative-detail"],
)
def test_a_lying_usage_is_neither_relayed_nor_recorded(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    usage: dict[str, Any],
) -> None:
    # Counts no record can hold were relayed to the client as the provider's (negative
    # ones), or failed the whole answer (past what orjson encodes: 503, the answer lost).
    provider = start_raw(json_answer(_answer(usage)))
    gateway = hosted_gateway(start_gateway, tmp_path, f"{provider.url}/v1", "m")
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers=HEADERS,
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "hello"
    assert "-" not in json.dumps(body.get("usage")), body  # no negative count relayed
    assert all(0 <= v <= 2**53 for v in (body.get("usage") or {}).values() if type(v) is int)
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 200
    if "prompt_tokens_details" not in usage:
        assert "usage" not in body and record["usage"] is None, record
