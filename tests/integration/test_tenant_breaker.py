"""One tenant cannot take a private backend away from every other tenant.

Tenant `acme` sends requests its private backend answers 500 to (an input the server
chokes on). Before breakers told tenants apart, three such requests in a row opened the
backend's breaker for everyone, and under `when_private_unavailable` the next request of
tenant `globex`, which the backend serves fine, went to the hosted provider: another
tenant's data left the organisation because of acme. Now acme's requests alone open a
breaker scoped to acme; globex keeps the private backend. With one tenant configured,
its failures open the backend's breaker as before.

The private backend is a scripted raw backend (its `/health` answers 200); the hosted one
a simulator reached through LiteLLM, so nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    EU_ZERO,
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    Sim,
    admin_status,
    backend,
    hosted_backend,
    served,
)
from tests.helpers.raw_backend import Answer, Post, RawBackend

pytestmark = LITELLM_WARNINGS

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu, version: "1"}
spec:
  tenants: [acme, globex]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted}]
"""
ACME = {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}
GLOBEX = {"id": "globex", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["*"]}
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)
POISON = "a prompt this server answers 500 to"


async def chokes_on_poison(writer: asyncio.StreamWriter, post: Post) -> bool:
    if POISON.encode() in post.body:
        body = b'{"error": {"message": "internal error"}}'
        head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
    else:
        body, head = ANSWER, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    return True


Start = Callable[[list[dict[str, Any]]], tuple[Gateway, Sim, RawBackend]]


@pytest.fixture
def setup(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> Start:
    def build(tenants: list[dict[str, Any]]) -> tuple[Gateway, Sim, RawBackend]:
        raw = start_raw(chokes_on_poison)
        hosted = start_sim("vllm", models=("m",), zero_latency=True)
        policies = tmp_path / "policies"
        policies.mkdir()
        (policies / "policy.yaml").write_text(POLICY)
        gateway = start_gateway(
            [
                backend("gpu", raw.url, "m", **EU_ZERO),
                hosted_backend("hosted", f"{hosted.url}/v1", "m"),
            ],
            policy={"paths": [str(policies)]},
            environ={"HOSTED_KEY": "k"},
            tenants=tenants,
            # Long enough that no breaker half-opens while a test runs.
            routing={"breaker": {"cooldown_s": 600, "max_cooldown_s": 600}},
        )
        return gateway, hosted, raw

    return build


def chat(gateway: Gateway, key: str, prompt: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": prompt}]},
        headers={"authorization": f"Bearer {key}"},
        timeout=120,  # the first hosted request imports LiteLLM
    )


def test_one_tenants_failing_requests_do_not_send_another_tenant_hosted(setup: Start) -> None:
    gateway, hosted, raw = setup([ACME, GLOBEX])
    for _ in range(3):  # the breaker's failure_threshold
        response = chat(gateway, TENANT_KEY, POISON)
        assert response.status_code == 200, response.text  # acme's own policy: hosted
    assert served(hosted) == 3 and len(raw.posts) == 3
    response = chat(gateway, OTHER_KEY, "hi")
    assert (response.status_code, response.content) == (200, ANSWER)  # the private answer
    assert served(hosted) == 3 and len(raw.posts) == 4  # globex's data stayed in
    assert chat(gateway, TENANT_KEY, "hi").status_code == 200
    assert len(raw.posts) == 4 and served(hosted) == 4  # acme's own breaker is open
    [gpu] = [b for b in admin_status(gateway.url)["backends"] if b["id"] == "gpu"]
    assert gpu["available"] and gpu["breaker"]["state"] == "closed"
    [scoped] = gpu["breaker"]["tenants"]
    assert (scoped["tenant"], scoped["state"], scoped["last_error"]) == ("acme", "open", "HTTP 500")
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert 'owngate_backend_tenant_breakers_open{backend="gpu"} 1.0' in metrics


def test_with_one_tenant_its_failing_requests_open_the_backend_as_before(setup: Start) -> None:
    gateway, hosted, raw = setup([ACME])
    for _ in range(3):
        assert chat(gateway, TENANT_KEY, POISON).status_code == 200
    response = chat(gateway, TENANT_KEY, "hi")
    assert response.status_code == 200, response.text
    assert len(raw.posts) == 3 and served(hosted) == 4  # the backend's breaker is open
    [gpu] = [b for b in admin_status(gateway.url)["backends"] if b["id"] == "gpu"]
    assert gpu["breaker"]["state"] == "open" and gpu["breaker"]["tenants"] == []
