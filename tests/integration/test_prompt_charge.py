"""A prompt that reached a backend is charged to the tenant's token budget even when no
byte of an answer comes back: the client leaving before the first byte, or the backend
not answering in time, must not let a tenant have prompts read (prefill, generation
that the backend abandons only when the gateway drops it) for nothing."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.state import TenantLimits
from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    TENANT_KEY,
    Gateway,
    backend,
    hosted_backend,
)
from tests.helpers.net import free_port
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

LIMITS = {"tokens_per_minute": 100, "concurrent_requests": 1}
# About 4 KB of prompt: its estimate (one token per 4 bytes, ~1,000) is past the budget.
ASK = {"model": "m", "messages": [{"role": "user", "content": "word " * 800}]}


def _tenants() -> list[dict[str, Any]]:
    return [
        {
            "id": "acme",
            "api_key_hashes": [hash_api_key(TENANT_KEY)],
            "models": ["*"],
            "limits": LIMITS,
        }
    ]


def _holding(released: threading.Event) -> Answer:
    """A backend that takes the first prompt and answers nothing until the test is over;
    any later one it answers at once (were it admitted), with a small usage."""
    seen = 0

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        nonlocal seen
        seen += 1
        if seen == 1:
            await asyncio.get_running_loop().run_in_executor(None, released.wait, 60)
            return False
        writer.write(json_answer_bytes())
        await writer.drain()
        return False

    return answer


def json_answer_bytes() -> bytes:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    body = orjson.dumps({"object": "chat.completion", "choices": [], "usage": usage})
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


def _post(gateway: Gateway, ask: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=30
    )


def _released(gateway: Gateway) -> bool:
    use = gateway.app.state.tenant_use("acme", TenantLimits(concurrent=1))
    return use.inflight == 0


def _leave_before_the_first_byte(gateway: Gateway, raw: RawBackend, body: bytes) -> None:
    """Send `body`, and close the connection once the backend has the prompt; return when
    the gateway has ended the request (499)."""
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        )
        until(lambda: len(raw.posts) == 1, "the prompt at the backend", timeout=30)
    until(lambda: _released(gateway), "the request over", timeout=30)


def _assert_tokens_spent(gateway: Gateway) -> None:
    refused = _post(gateway, ASK)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_before_the_first_byte_is_charged_its_prompt(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    stream: bool,
) -> None:
    released = threading.Event()
    raw = start_raw(_holding(released))
    gateway = start_gateway([backend("gpu", raw.url, "m")], tenants=_tenants())
    try:
        _leave_before_the_first_byte(gateway, raw, orjson.dumps({**ASK, "stream": stream}))
        _assert_tokens_spent(gateway)
    finally:
        released.set()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_a_hosted_call_is_charged_its_prompt(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    stream: bool,
) -> None:
    released = threading.Event()
    raw = start_raw(_holding(released))
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", f"{raw.url}/v1", "m")],
        tenants=_tenants(),
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
    )
    try:
        _leave_before_the_first_byte(gateway, raw, orjson.dumps({**ASK, "stream": stream}))
        _assert_tokens_spent(gateway)
    finally:
        released.set()


def test_a_backend_that_does_not_answer_in_time_charges_the_prompt(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
) -> None:
    released = threading.Event()
    raw = start_raw(_holding(released))
    slow = backend("gpu", raw.url, "m", first_byte_timeout_s=0.5)
    gateway = start_gateway([slow], tenants=_tenants())
    try:
        assert _post(gateway, ASK).status_code == 504
        _assert_tokens_spent(gateway)
    finally:
        released.set()


def test_a_backend_that_refuses_the_request_charges_nothing(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
) -> None:
    async def bad_request(writer: asyncio.StreamWriter, _post: Post) -> bool:
        body = b'{"error":{"message":"no","type":"invalid_request_error"}}'
        head = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return False

    raw = start_raw(bad_request)
    gateway = start_gateway([backend("gpu", raw.url, "m")], tenants=_tenants())
    assert [_post(gateway, ASK).status_code for _ in range(2)] == [400, 400]


def _hosted(start_gateway: Callable[..., Gateway], tmp_path: Path, url: str) -> Gateway:
    """A gateway whose one backend is hosted at `url` (no private one to fail over to)."""
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    return start_gateway(
        [hosted_backend("hosted", url, "m")],
        tenants=_tenants(),
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
    )


def test_a_hosted_provider_that_fails_with_an_error_status_charges_nothing(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    async def unavailable(writer: asyncio.StreamWriter, _post: Post) -> bool:
        body = b'{"error":{"message":"busy","type":"server_error"}}'
        head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return False

    raw = start_raw(unavailable)
    gateway = _hosted(start_gateway, tmp_path, f"{raw.url}/v1")
    first = _post(gateway, ASK)
    assert first.status_code in (502, 503), first.text
    assert len(raw.posts) >= 1  # the provider was called, and failed
    # Charged, the ~1,000 tokens of the prompt would leave the next request a 429.
    second = _post(gateway, ASK)
    assert second.status_code != 429, second.text


def test_a_hosted_provider_that_cannot_be_reached_charges_nothing(
    start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    gateway = _hosted(start_gateway, tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    first = _post(gateway, ASK)
    assert first.status_code in (502, 503), first.text
    second = _post(gateway, ASK)
    assert second.status_code != 429, second.text
