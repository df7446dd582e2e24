"""What a client holding a valid key tried, to choose its tenant, policy or backend, and
what it got (a red-team pass over the routing decision, kept as regressions).

`acme` may use `m` on `gpu-eu` only (its policy: EU residency, no fallback); `other` may
use `gpu-other` only. Headers that name a tenant, backend, policy, model or another key
change nothing: the key in `Authorization` picks the tenant, the tenant's policy the
backends. Paths the gateway does not serve reach no backend.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import EU_ZERO, OTHER_KEY, TENANT_KEY, Gateway, Sim, backend

POLICIES = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: acme}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  backends: {deny: [gpu-other]}
  fallback: {mode: never}
---
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: other}
spec:
  tenants: [other]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  backends: {allow: [gpu-other]}
  fallback: {mode: never}
"""
CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
# Headers other gateways, proxies or SDKs read as a tenant, a key, a backend or a model.
HOSTILE_HEADERS = [
    {"x-owngate-tenant": "other", "x-tenant-id": "other", "openai-organization": "other"},
    {"x-api-key": OTHER_KEY, "api-key": OTHER_KEY},  # Anthropic's and Azure's key headers
    {"x-owngate-backend": "gpu-other", "x-owngate-policy": "other", "x-model": "o"},
    {"x-litellm-api-base": "http://127.0.0.1:9", "x-forwarded-host": "gpu-other"},
    {"x-forwarded-for": "10.0.0.1", "forwarded": "for=10.0.0.1;host=gpu-other"},
]
# Paths of other APIs (OpenAI's newer ones, Azure's, LiteLLM's) and spellings of ours.
UNSERVED_PATHS = [
    "/v1/responses",
    "/v1/messages",
    "/openai/deployments/m/chat/completions",
    "/chat/completions",
    "/v1/chat/completions/",
    "//v1/chat/completions",
    "/V1/chat/completions",
    "/v1/chat/completions;x",
    "/v1/engines/m/completions",
    "/v1/batches",
    "/v1/files",
]


@pytest.fixture
def rig(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim, Sim]:
    """(gateway, acme's backend, the other tenant's backend)."""
    mine, theirs = (start_sim("vllm", models=("m", "o"), zero_latency=True) for _ in "ab")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICIES)
    gateway = start_gateway(
        [
            backend("gpu-eu", mine.url, "m", **EU_ZERO),
            backend("gpu-other", theirs.url, "m", "o", region="us-east-1"),
        ],
        policy={"paths": [str(tmp_path / "policies")]},
        tenants=[
            {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
            {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["*"]},
        ],
    )
    return gateway, mine, theirs


def posts(sim: Sim) -> int:
    return sum(1 for r in sim.app.captured() if r.method == "POST")


def test_no_header_picks_another_tenant_policy_or_backend(rig: tuple[Gateway, Sim, Sim]) -> None:
    gateway, mine, theirs = rig
    for headers in HOSTILE_HEADERS:
        served_before = posts(mine)
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json=CHAT,
            headers={**gateway.headers, **headers},
            timeout=30,
        )
        assert response.status_code == 200, (headers, response.text)
        assert posts(mine) == served_before + 1, headers
    # `o` is the other tenant's model: a header naming it does not make it acme's.
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, "model": "o"},
        headers={**gateway.headers, "x-owngate-tenant": "other", "x-api-key": OTHER_KEY},
        timeout=30,
    )
    assert response.json()["error"]["code"] == "model_not_found"
    assert posts(theirs) == 0


def test_another_tenants_key_outside_authorization_authenticates_nobody(
    rig: tuple[Gateway, Sim, Sim],
) -> None:
    gateway, mine, theirs = rig
    for name in ("x-api-key", "api-key", "proxy-authorization"):
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json=CHAT,
            headers={name: f"Bearer {OTHER_KEY}" if "auth" in name else OTHER_KEY},
            timeout=30,
        )
        assert response.status_code == 401, (name, response.text)
        assert response.json()["error"]["code"] == "missing_api_key"
    assert posts(mine) == posts(theirs) == 0


def test_paths_the_gateway_does_not_serve_reach_no_backend(
    rig: tuple[Gateway, Sim, Sim],
) -> None:
    gateway, mine, theirs = rig
    for path in UNSERVED_PATHS:
        response = httpx.post(
            f"{gateway.url}{path}", json=CHAT, headers=gateway.headers, timeout=30
        )
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"]["code"] == "not_found", path
    assert posts(mine) == posts(theirs) == 0
