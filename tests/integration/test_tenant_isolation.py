"""What one tenant, holding only its own key, tried against another tenant, and what it
got (a red-team pass over the boundary between tenants, kept as regressions).

`acme` and `other` may both use `m`; only `other` may use `o`. Backends: `b0`, which
publishes its KV cache (the picker's `kv` term prefers it while all are idle), and `b1`,
`b2`, which publish nothing; `other`'s policy denies `b0`. The provenance log is on, so
every answer's receipt names the backend that served it: what the gateway's routing does
with a request is visible to its client.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, Gateway, Sim, backend, logged_gateway
from tests.helpers.waiting import until

ORIGIN = "gw.test/tenants"
POLICIES = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: acme}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
---
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: other}
spec:
  tenants: [other]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  backends: {deny: [b0]}
  fallback: {mode: never}
"""
# A conversation whose earlier turns (the affinity prefix: all but the newest message) are
# the other tenant's: its system prompt and a first question.
HISTORY = [
    {"role": "system", "content": "You are the payroll assistant of the other tenant. " * 2},
    {"role": "user", "content": "What is Dana's salary this year?"},
]


def chat(gateway: Gateway, key: str, newest: str, model: str = "m") -> httpx.Response:
    messages = [*HISTORY, {"role": "user", "content": newest}]
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": model, "max_tokens": 2, "messages": messages},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def posts(sims: list[Sim]) -> list[int]:
    return [sum(1 for r in sim.app.captured() if r.method == "POST") for sim in sims]


@pytest.fixture
def rig(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, list[Sim]]:
    sims = [start_sim("vllm", models=("m", "o"), zero_latency=True) for _ in range(3)]
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICIES)
    gateway = logged_gateway(
        start_gateway,
        tmp_path,
        [
            backend("b0", sims[0].url, "m"),
            backend("b1", sims[1].url, "m", "o", kind="openai"),
            backend("b2", sims[2].url, "m", "o", kind="openai"),
        ],
        ORIGIN,
        policy={"paths": [str(tmp_path / "policies")]},
        tenants=[
            {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
            {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m", "o"]},
        ],
    )
    return gateway, sims


def test_another_tenants_prompt_does_not_steer_a_request(
    rig: tuple[Gateway, list[Sim]],
) -> None:
    """Affinity remembered which backend served a prompt prefix last, whoever sent it: a
    tenant sending a guess of another tenant's conversation was routed where that
    tenant's request had gone (and read it in the receipt) when the guess was right,
    elsewhere when not: a test of what other tenants' prompts hold. It could also move
    where another tenant's prefix is served. Now each tenant's prefixes are its own:
    acme's copy goes where acme's requests go with no memory of it, `b0`."""
    gateway, sims = rig
    response = chat(gateway, OTHER_KEY, "And next year?")
    assert response.status_code == 200, response.text
    assert posts(sims)[0] == 0  # denied to `other`: b1 or b2 served it
    response = chat(gateway, TENANT_KEY, "And the year after?")
    assert response.status_code == 200, response.text
    assert posts(sims)[0] == 1, posts(sims)


def test_a_tenant_reads_no_receipt_proof_or_model_of_another(
    rig: tuple[Gateway, list[Sim]],
) -> None:
    """Another tenant's request id gets the answer an unknown one gets, for the receipt
    and for the inclusion proof, even once a checkpoint covers it; `/v1/models` lists
    the tenant's own models, and asking for another's is the 404 of a model that does
    not exist."""
    gateway, _ = rig
    theirs = chat(gateway, OTHER_KEY, "hello", model="o")
    assert theirs.status_code == 200, theirs.text
    request_id = theirs.headers["x-request-id"]
    other = {"authorization": f"Bearer {OTHER_KEY}"}
    proof = f"{gateway.url}/v1/provenance/proofs/{request_id}"
    until(lambda: httpx.get(proof, headers=other, timeout=10).status_code == 200, "a proof")
    for kind in ("receipts", "proofs"):
        for wanted in (request_id, "req_000000000000000000000000"):
            url = f"{gateway.url}/v1/provenance/{kind}/{wanted}"
            response = httpx.get(url, headers=gateway.headers, timeout=10)
            assert response.status_code == 404, (kind, response.text)
            assert response.json()["error"]["message"] == (
                "no receipt for that request id (or not yours)"
            )
    listed = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers, timeout=10)
    assert [m["id"] for m in listed.json()["data"]] == ["m"]
    errors = [chat(gateway, TENANT_KEY, "hi", model=name).json()["error"] for name in "ox"]
    assert [e["code"] for e in errors] == ["model_not_found"] * 2
    assert errors[0]["message"].replace("`o`", "`x`") == errors[1]["message"]


# One header holding both tenants' keys (as a proxy joining copies would write it), or a
# key after another scheme or separator.
TWO_KEYS = [
    f"Bearer {TENANT_KEY} {OTHER_KEY}",
    f"Bearer {OTHER_KEY} {TENANT_KEY}",
    f"Bearer {TENANT_KEY},Bearer {OTHER_KEY}",
    f"Bearer {TENANT_KEY}, {OTHER_KEY}",
    f"Bearer\t{OTHER_KEY}",
    f"Token {OTHER_KEY}",
]


def test_an_authorization_value_naming_two_keys_authenticates_nobody(
    rig: tuple[Gateway, list[Sim]],
) -> None:
    """Such a value is no key, never the first or the last one: 401, and no backend
    hears of the request."""
    gateway, sims = rig
    for value in TWO_KEYS:
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "o", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": value},
            timeout=30,
        )
        assert response.status_code == 401, (value, response.text)
        assert response.json()["error"]["code"] == "invalid_api_key", value
    assert posts(sims) == [0, 0, 0]
