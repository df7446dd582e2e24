"""A tenant's tokens-per-minute budget is reserved at admission (gateway/api/reservation.py):
a burst of expensive requests is admitted only as far as their reservations fit the
minute's budget, a request that asks for more than the whole budget is refused, and a
reservation no backend used is given back.

The backend is a scripted raw socket (tests/helpers/raw_backend.py) that holds every
request until the test lets it answer, so the burst is all in flight at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx

from gateway.state import TenantLimits
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Gateway, backend
from tests.helpers.net import free_port
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.waiting import until, until_async

TPM = 1000
MAX_TOKENS = 400  # with its prompt, two requests fit the minute's budget, not three
BURST = 12
WAIT_S = 30.0
USAGE = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}


def _body(max_tokens: int | None = MAX_TOKENS) -> bytes:
    doc: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        doc["max_tokens"] = max_tokens
    return json.dumps(doc).encode()


def _reservation(body: bytes) -> int:
    """What such a request reserves: its prompt estimate and its max_tokens."""
    max_tokens: int = json.loads(body)["max_tokens"]
    return -(-len(body) // 4) + max_tokens


class HeldBackend:
    """Holds every completion until `go` is set, then answers it with `USAGE`."""

    def __init__(self) -> None:
        self.go = threading.Event()

    async def __call__(self, writer: asyncio.StreamWriter, _post: Post) -> bool:
        await until_async(self.go.is_set, "the test lets the held answers end", timeout=60)
        answer = {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": USAGE,
        }
        data = json.dumps(answer).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(data) + data)
        await writer.drain()
        return False


def _gateway(start_gateway: Callable[..., Gateway], url: str, **limits: int) -> Gateway:
    tenants = [
        {
            "id": "acme",
            "api_key_hashes": [hash_api_key(TENANT_KEY)],
            "models": ["*"],
            "limits": {"tokens_per_minute": TPM, **limits},
        }
    ]
    return start_gateway([backend("gpu", url, "m")], tenants=tenants)


def _post(gateway: Gateway, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json"},
        timeout=WAIT_S,
    )


def test_a_burst_is_admitted_only_as_far_as_its_reservations_fit(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    """The attack: one key fires a burst of requests each asking for `MAX_TOKENS`; the
    budget used to be charged only when answers ended, so all were admitted at once."""
    held = HeldBackend()
    raw = start_raw(held)
    gateway = _gateway(start_gateway, raw.url)
    body = _body()
    fits = TPM // _reservation(body)
    assert fits == 2
    limits = TenantLimits(tokens_per_minute=TPM)
    try:
        with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
            calls = [pool.submit(_post, gateway, body) for _ in range(BURST)]
            # Each request either reaches the backend (and is held there) or is refused.
            until(
                lambda: len(raw.posts) + sum(call.done() for call in calls) == BURST,
                "every request of the burst held by the backend or refused",
                timeout=WAIT_S,
                detail=lambda: (len(raw.posts), sum(call.done() for call in calls)),
            )
            assert len(raw.posts) == fits, "admitted past the budget"
            use = gateway.app.state.tenant_use("acme", limits)
            assert use.reserved == fits * _reservation(body)
            refused = [call.result() for call in calls if call.done()]
            assert len(refused) == BURST - fits
            for response in refused:
                assert response.status_code == 429, response.text
                error = response.json()["error"]
                assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
                assert int(response.headers["retry-after"]) >= 1
            held.go.set()
            served = [call.result(timeout=WAIT_S) for call in calls]
    finally:
        held.go.set()
    assert sum(r.status_code == 200 for r in served) == fits
    # Settled: the reservations were replaced by the usage reported.
    assert gateway.app.state.tenant_use("acme", limits).reserved == 0


def test_a_request_asking_for_more_than_the_whole_budget_is_refused(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    held = HeldBackend()
    held.go.set()
    raw = start_raw(held)
    gateway = _gateway(start_gateway, raw.url)
    response = _post(gateway, _body(max_tokens=TPM + 1))
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert f"Limit {TPM}, Requested {TPM + 1}" in error["message"]
    assert "retry-after" not in response.headers  # waiting never makes it fit
    assert raw.posts == []
    assert _post(gateway, _body(max_tokens=TPM - 100)).status_code == 200  # nothing kept


def test_a_reservation_no_backend_took_is_given_back(
    start_gateway: Callable[..., Gateway],
) -> None:
    """Nothing listens at the backend's port: the request fails before any backend took
    its prompt, so its whole reservation comes back and the next one fits."""
    gateway = _gateway(start_gateway, f"http://127.0.0.1:{free_port()}")
    body = _body(max_tokens=TPM - 100)
    first = _post(gateway, body)
    assert first.status_code >= 500, first.text
    limits = TenantLimits(tokens_per_minute=TPM)
    use = gateway.app.state.tenant_use("acme", limits)
    assert (use.reserved, use.tokens) == (0, 0)
    assert _post(gateway, body).status_code >= 500  # admitted again, not 429
