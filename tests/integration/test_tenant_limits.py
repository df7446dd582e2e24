"""Per-tenant rate limits on the request path: OpenAI-style 429 with retry-after."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.serving import ServerThread
from gateway.state import RateLimited, TenantLimits
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Gateway, Sim, backend, gateway_config
from tests.helpers.waiting import until

BODY = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def post(gateway: Gateway) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=BODY,
        timeout=30,
        headers={"authorization": f"Bearer {TENANT_KEY}"},
    )


def with_limits(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], **limits: int
) -> tuple[Gateway, Sim]:
    from gateway.tenants import hash_api_key
    from tests.helpers.gateways import OTHER_KEY

    sim = start_sim(
        "vllm",
        models=("m",),
        **({"zero_latency": True} if "slow" not in limits else {"decode_tokens_per_s": 10.0}),
    )
    limits.pop("slow", None)
    tenants = [
        {
            "id": "acme",
            "api_key_hashes": [hash_api_key(TENANT_KEY)],
            "models": ["*"],
            "limits": limits,
        },
        {"id": "limited", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": []},
    ]
    return start_gateway([backend("gpu", sim.url, "m")], tenants=tenants), sim


def test_requests_per_minute(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    gateway, sim = with_limits(start_sim, start_gateway, requests_per_minute=2)
    statuses = [post(gateway).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    refused = post(gateway)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "requests"
    assert int(refused.headers["retry-after"]) >= 1
    assert sim.app.stats.completed == 2  # refused requests never reach a backend


def test_tokens_per_minute_are_charged_from_usage(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    gateway, _ = with_limits(start_sim, start_gateway, tokens_per_minute=5)
    assert post(gateway).status_code == 200  # uses ~6 tokens: the budget is now spent
    refused = post(gateway)
    assert refused.status_code == 429
    assert "retry-after" in refused.headers
    # OpenAI's shape for a TPM refusal: the type names the limit that was hit.
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert "tokens per min" in error["message"]


def test_concurrent_requests(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    gateway, sim = with_limits(start_sim, start_gateway, concurrent_requests=1, slow=1)
    first: list[int] = []
    thread = threading.Thread(target=lambda: first.append(post(gateway).status_code))
    thread.start()
    until(lambda: sim.app.stats.in_flight > 0, "the first request at the backend", timeout=30.0)
    assert post(gateway).status_code == 429
    thread.join(timeout=30)
    assert first == [200]
    assert post(gateway).status_code == 200  # the slot was given back


@pytest.mark.parametrize("stream", [False, True])
def test_the_budget_is_charged_before_the_client_sees_the_answer_end(
    start_sim: Callable[..., Sim], stream: bool
) -> None:
    """A client that sends its next request the moment an answer ends must meet a budget
    that already holds that answer: the charge lands before the message that ends it
    (it used to land after, so the next request could be admitted first)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    tenants = [
        {
            "id": "acme",
            "api_key_hashes": [hash_api_key(TENANT_KEY)],
            "models": ["*"],
            "limits": {"tokens_per_minute": 5},
        }
    ]
    app = create_app(gateway_config([backend("gpu", sim.url, "m")], tenants=tenants), environ={})
    limits = TenantLimits(tokens_per_minute=5)
    seen: list[str] = []

    async def probe_at_the_end(scope: Any, receive: Any, send: Any) -> None:
        async def send_checked(message: Any) -> None:
            ends = message["type"] == "http.response.body" and not message.get("more_body")
            if ends and scope.get("path") == "/v1/chat/completions":
                try:
                    admission = await app.state.acquire("acme", limits)
                except RateLimited:
                    seen.append("budget spent")
                else:
                    await admission.release(0)
                    seen.append("still admitted")
            await send(message)

        await app(scope, receive, send_checked)

    with ServerThread(probe_at_the_end) as server:
        response = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={**BODY, "stream": stream},
            timeout=30,
            headers={"authorization": f"Bearer {TENANT_KEY}"},
        )
    assert response.status_code == 200
    assert seen == ["budget spent"]


def test_a_request_a_stale_worker_refuses_costs_no_part_of_the_limit(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker of `serve --workers N` that could not read a changed policy refuses 503
    # until it reads it (docs/security.md). It refused after admitting the request: each
    # refusal (and each retry its `retry-after: 1` invites) spent the tenant's
    # requests_per_minute, so once the worker caught up the tenant was refused 429.
    gateway, sim = with_limits(start_sim, start_gateway, requests_per_minute=1)
    policies = type(gateway.app.parts.policies)
    monkeypatch.setattr(policies, "stale", property(lambda _self: True))
    refused = [post(gateway) for _ in range(3)]
    assert [r.status_code for r in refused] == [503] * 3
    assert all("trust-policy" in r.json()["error"]["message"] for r in refused)
    models = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers, timeout=30)
    assert models.status_code == 503  # not what an older set allowed
    monkeypatch.undo()
    assert post(gateway).status_code == 200  # before: 429, the minute spent on refusals
    assert sim.app.stats.completed == 1
