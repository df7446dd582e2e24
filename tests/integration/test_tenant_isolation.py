"""What one tenant, holding only its own key, tried against another tenant, and what it
got (a red-team pass over the boundary between tenants, kept as regressions).

`acme` and `other` may both use `m`; only `other` may use `o`. Backends: `b0`, which
publishes its KV cache (the picker's `kv` term prefers it while all are idle), and `b1`,
`b2`, which publish nothing; `other`'s policy denies `b0`. The provenance log is on, so
every answer's receipt names the backend that served it: what the gateway's routing does
with a request is visible to its client.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.canonical import canonical_json
from gateway.provenance import (
    load_verifiers,
    verify_commitment,
    verify_receipt,
    write_signing_key,
)
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.receipts import receipt_claims
from gateway.sim import Faults
from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    logged_gateway,
)
from tests.helpers.provenance import request_records
from tests.helpers.waiting import until, until_async

pytestmark = LITELLM_WARNINGS  # the hosted test's LiteLLM

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
            backend("b0", sims[0].url, "m", owner="partner-lab"),
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
    for kind in ("receipts", "proofs"):  # the owner's own: stored by no cache on the way
        own = httpx.get(f"{gateway.url}/v1/provenance/{kind}/{request_id}", headers=other)
        assert own.status_code == 200, own.text
        assert own.headers["cache-control"] == "no-store", kind
        assert own.headers["x-content-type-options"] == "nosniff", kind
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


def test_a_served_requests_receipt_confirms_no_guess_of_the_backends_its_policy_judged(
    rig: tuple[Gateway, list[Sim]], tmp_path: Path
) -> None:
    """A dispatch record's trace names every backend serving the model, each with its
    verdict and rule: for `other`, `b0` excluded by its policy's `backends` rule, which
    no answer tells it (`/v1/models` names no owner of it, a refusal's 403 no backend).
    Everything else in the record `other` knows or can guess: its request id, tenant and
    model, the policy (the receipt names its digest; a 403 names its id), the backend the
    receipt names and its declared facts (its owner is `/v1/models`' `owned_by`), a time
    to the millisecond and the commitment its own salts open. So hashing a guess of the
    trace against the receipt's leaf hash confirmed which backends (another tenant's GPU
    box) serve its model, as a refusal's receipt did before refusals held `blind`. Every
    dispatch record now holds `blind` too: 32 random bytes no answer or receipt gives."""
    gateway, _ = rig
    response = chat(gateway, OTHER_KEY, "hello")
    assert response.status_code == 200, response.text
    claims = receipt_claims(base64.b64decode(response.headers["x-owngate-receipt"]))
    log = tmp_path / "log"
    (record,) = request_records(log, response.headers["x-request-id"], "dispatch")
    excluded = [step for step in record["trace"] if step["verdict"] == "excluded"]
    assert [step["backend"] for step in excluded] == ["b0"], record["trace"]
    assert leaf_hash(canonical_json(record)) == claims.dispatch_hash  # the record named
    guess = {key: value for key, value in record.items() if key != "blind"}
    assert leaf_hash(canonical_json(guess)) != claims.dispatch_hash, "the guess matched"
    assert len(record["blind"]) == 64


def test_models_name_no_owner_of_a_backend_the_tenants_policy_denies(
    rig: tuple[Gateway, list[Sim]],
) -> None:
    """`owned_by` in `/v1/models` was the owner of the first configured backend serving
    the name, whoever's policy admitted it: `other`, whose policy denies `b0`, read
    `partner-lab`, a fact of a backend it can never reach (as the 403's reason used to
    tell, docs/security.md "Routing internals are not public"). Now it is the owner of
    the first backend the tenant's own decision admits."""
    gateway, _ = rig
    owners = {}
    for key in (TENANT_KEY, OTHER_KEY):
        listed = httpx.get(
            f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=10
        )
        assert listed.status_code == 200, listed.text
        owners[key] = {m["id"]: m["owned_by"] for m in listed.json()["data"]}
    assert owners[TENANT_KEY] == {"m": "partner-lab"}
    assert owners[OTHER_KEY] == {"m": "test", "o": "test"}


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


# Both tenants fall back to one hosted provider account (a simulator behind LiteLLM's
# OpenAI adapter): the identifiers a client writes name things in that shared account.
HOSTED_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: shared-account}
spec:
  tenants: [acme, other]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: provider}]
"""
IDENTIFIERS = ("prompt_cache_key", "user", "safety_identifier")


@pytest.fixture
def hosted_rig(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim, str]:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(HOSTED_POLICY)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    gateway = start_gateway(
        [hosted_backend("provider", f"{sim.url}/v1", "m")],
        environ={"HOSTED_KEY": "sk-shared-account"},
        policy={"paths": [str(tmp_path / "policies")]},
        provenance=provenance(tmp_path),
        tenants=TWO_TENANTS,
    )
    return gateway, sim, vkey


TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]


def provenance(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    """The log in `tmp_path / "log"`, signed with `tmp_path / "log.key"`."""
    return {
        "dir": str(tmp_path / "log"),
        "origin": ORIGIN,
        "signing_key_file": str(tmp_path / "log.key"),
        "checkpoint_interval_ms": 20,
        **settings,
    }


def sent_identifiers(sim: Sim) -> list[dict[str, Any]]:
    """The identifier fields of each chat request the provider got, in order."""
    bodies = [orjson.loads(r.body) for r in sim.app.captured("/v1/chat/completions")]
    return [{k: body.get(k) for k in IDENTIFIERS} for body in bodies]


def test_a_tenant_names_no_other_tenants_cache_key_or_user_at_the_provider(
    hosted_rig: tuple[Gateway, Sim, str], tmp_path: Path
) -> None:
    """All tenants share the gateway's provider account. A tenant writing another's
    `prompt_cache_key` read that tenant's cache hits from `cached_tokens`; writing its
    `user` or `safety_identifier` had its own abuse charged to that tenant's user. Now
    each is sent as the tenant's own digest: the same value from one tenant is the same
    identifier sent (its cache and its users work as before), from two tenants two
    identifiers, never the value written, within OpenAI's 64 characters. The signed
    record still commits to the client's own bytes: its receipt opens them."""
    gateway, sim, vkey = hosted_rig
    written = dict.fromkeys(IDENTIFIERS, "other-tenant-conversation-7f3a")
    doc = {"model": "m", "max_tokens": 2, "messages": HISTORY, **written}
    bodies, responses = [], []
    for key in (OTHER_KEY, OTHER_KEY, TENANT_KEY):
        body = orjson.dumps(doc)
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            content=body,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=120,  # the first imports LiteLLM
        )
        assert response.status_code == 200, response.text
        bodies.append(body)
        responses.append(response)
    theirs, again, mine = sent_identifiers(sim)
    assert theirs == again  # one tenant, one value: one identifier sent
    for name in IDENTIFIERS:
        if theirs[name] is None and mine[name] is None:
            continue  # not forwarded by LiteLLM's adapter at all: nothing to name
        assert theirs[name] != mine[name], name
        for sent in (theirs[name], mine[name]):
            assert isinstance(sent, str) and sent.startswith("og-"), (name, sent)
            assert "other-tenant" not in sent and len(sent) <= 64, (name, sent)
    assert theirs["prompt_cache_key"] is not None  # the leak the red team read
    verifiers = load_verifiers([vkey])
    for body, response in zip(bodies, responses, strict=True):
        request_id = response.headers["x-request-id"]
        receipt = verify_receipt(base64.b64decode(response.headers["x-owngate-receipt"]), verifiers)
        (dispatch,) = request_records(tmp_path / "log", request_id, "dispatch")
        verify_commitment("request", dispatch["request_commitment"], receipt.salts.request, body)


@pytest.fixture
def private_rig(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim, str]:
    """One private `kind: openai` backend both tenants may use: a router in front of a
    provider account (a LiteLLM proxy), shared as the hosted account is."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICIES)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    gateway = start_gateway(
        [backend("b1", sim.url, "m", kind="openai")],
        policy={"paths": [str(tmp_path / "policies")]},
        provenance=provenance(tmp_path),
        tenants=TWO_TENANTS,
    )
    return gateway, sim, vkey


def test_a_tenant_names_no_other_tenants_cache_key_or_user_at_a_private_router(
    private_rig: tuple[Gateway, Sim, str], tmp_path: Path
) -> None:
    """A private backend may be a router that forwards on one provider account: it got
    `user`, `safety_identifier` and `prompt_cache_key` as written, so a tenant could charge
    its abuse to another's end user or name another's prompt cache there. Now each is the
    tenant's own digest, as on the hosted path, also written in another case (`User`: a
    router in Go reads it) or twice; the signed record still commits to the client's
    bytes, and the client gets the backend's answer as before."""
    gateway, sim, vkey = private_rig
    written = dict.fromkeys(IDENTIFIERS, "other-tenant-conversation-7f3a")
    plain = orjson.dumps({"model": "m", "max_tokens": 2, "messages": HISTORY, **written})
    # `User` in another case (`user` twice is refused: a first-wins reader takes the first
    # copy; gateway/api/body_names.py)
    twice = plain[:-1] + b',"User":"other-tenant-x"}'
    bodies, responses = [], []
    for key, body in (
        (OTHER_KEY, plain),
        (OTHER_KEY, plain),
        (TENANT_KEY, plain),
        (TENANT_KEY, twice),
    ):
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            content=body,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]  # the backend's answer
        bodies.append(body)
        responses.append(response)
    sent = [r.body for r in sim.app.captured("/v1/chat/completions")]
    theirs, again, mine, repeated = [orjson.loads(b) for b in sent]
    assert b"other-tenant" not in b"".join(sent)
    assert {k: theirs[k] for k in IDENTIFIERS} == {k: again[k] for k in IDENTIFIERS}
    for name in IDENTIFIERS:
        assert theirs[name] != mine[name], name
        for value in (theirs[name], mine[name], repeated[name]):
            assert value.startswith("og-") and len(value) <= 64, (name, value)
    assert repeated["User"].startswith("og-") and repeated["User"] != mine["user"]
    assert sent[3].count(b'"user":') == 1
    refused = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=plain[:-1] + b',"user":"other-tenant-y"}',
        headers={"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json"},
        timeout=60,
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "user"
    assert len(sim.app.captured("/v1/chat/completions")) == 4
    verifiers = load_verifiers([vkey])
    for body, response in zip(bodies, responses, strict=True):
        request_id = response.headers["x-request-id"]
        receipt = verify_receipt(base64.b64decode(response.headers["x-owngate-receipt"]), verifiers)
        (dispatch,) = request_records(tmp_path / "log", request_id, "dispatch")
        verify_commitment("request", dispatch["request_commitment"], receipt.salts.request, body)


def test_a_tenants_many_requests_leave_the_others_receipts(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """The receipts kept for lookup are bounded for all tenants together, and the oldest
    went first, whoever's: a tenant sending more requests than `receipts_kept` (100,000
    by default, within its rate limits) had every other tenant's receipts answer 404.
    Now the tenant holding the most gives up its own oldest."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    gateway = start_gateway(
        [backend("gpu", sim.url, "m")],
        provenance=provenance(tmp_path, receipts_kept=4),
        tenants=TWO_TENANTS,
    )

    def request(key: str) -> str:
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "m", "max_tokens": 2, "messages": HISTORY},
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return response.headers["x-request-id"]

    def receipt(key: str, request_id: str) -> int:
        url = f"{gateway.url}/v1/provenance/receipts/{request_id}"
        return httpx.get(url, headers={"authorization": f"Bearer {key}"}, timeout=10).status_code

    theirs = [request(OTHER_KEY) for _ in range(2)]
    mine = [request(TENANT_KEY) for _ in range(12)]
    assert [receipt(OTHER_KEY, i) for i in theirs] == [200, 200]
    assert [receipt(TENANT_KEY, i) for i in mine] == [404] * 10 + [200] * 2


def test_a_tenant_shares_no_prefix_cache_with_another_on_a_salted_backend(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    """A vLLM server's prefix cache is shared by every tenant it serves: an answer's
    cached prompt tokens (and its time to first token) tell a tenant whether another
    sent the same conversation lately. vLLM partitions its cache by `cache_salt`; on a
    backend declared `isolate_prefix_cache`, the gateway sets it to the tenant's own, the
    client's salt (in any case spelling) mixed in, never in its place. A backend without
    the declaration gets the client's bytes as they were."""
    salted, plain = (start_sim("vllm", models=(m,), zero_latency=True) for m in ("m", "n"))
    gateway = start_gateway(
        [
            {**backend("salted", salted.url, "m"), "isolate_prefix_cache": True},
            backend("plain", plain.url, "n"),
        ],
        tenants=[{**t, "models": ["m", "n"]} for t in TWO_TENANTS],
    )

    def send(key: str, model: str = "m", **extra: Any) -> bytes:
        doc = {"model": model, "max_tokens": 2, "messages": HISTORY, **extra}
        body = orjson.dumps(doc)
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            content=body,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return body

    send(OTHER_KEY)
    send(OTHER_KEY)
    send(TENANT_KEY)
    send(TENANT_KEY, cache_salt="their-salt")
    send(OTHER_KEY, cache_salt="their-salt")
    send(TENANT_KEY, Cache_Salt="their-salt")
    bodies = [orjson.loads(r.body) for r in salted.app.captured("/v1/chat/completions")]
    salts = [b["cache_salt"] for b in bodies]
    assert salts[0] == salts[1]  # one tenant: one partition, its cache still serves it
    assert len(set(salts[1:5])) == 4, salts  # two tenants, with and without a salt
    assert salts[5] == salts[2]  # a spelling a Go server would read is not the salt
    assert "Cache_Salt" not in bodies[5] and "their-salt" not in str(salts)
    assert all(b["messages"] == HISTORY and b["model"] == "m" for b in bodies)
    sent = send(TENANT_KEY, "n", cache_salt="mine")
    assert plain.app.captured("/v1/chat/completions")[-1].body == sent


def test_a_tenant_shares_no_prefix_cache_with_another_through_embeddings(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    """vLLM's embeddings requests read `cache_salt` as its chat requests do (its pooling
    requests' `PoolingBasicRequestMixin`), and an embedding model whose pooling is
    causal keeps its prompts' prefixes in the same prefix cache, shared by every tenant
    unless salted. On a backend declared `isolate_prefix_cache` the gateway salted chat
    and completion bodies only: an embeddings body went out as the client wrote it,
    unsalted (every tenant in one partition, so one tenant's latency told it whether
    another had embedded the same beginning lately), or with whatever salt the client
    wrote, another tenant's included (computable from its tenant id). Now it is salted
    like the others."""
    salted = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway(
        [{**backend("salted", salted.url, "m"), "isolate_prefix_cache": True}],
        tenants=TWO_TENANTS,
    )
    document = "Discharge summary of the other tenant's patient, Dana, ward 4: " * 4

    def embed(key: str, **extra: Any) -> None:
        response = httpx.post(
            f"{gateway.url}/v1/embeddings",
            json={"model": "m", "input": document, **extra},
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert response.status_code == 200, response.text

    embed(OTHER_KEY)
    embed(TENANT_KEY)
    embed(TENANT_KEY, cache_salt="their-salt")
    embed(OTHER_KEY, cache_salt="their-salt")
    bodies = [orjson.loads(r.body) for r in salted.app.captured("/v1/embeddings")]
    salts = [b.get("cache_salt") for b in bodies]
    assert None not in salts, salts  # every embeddings body is salted
    assert len(set(salts)) == 4, salts  # two tenants, with and without a salt of their own
    assert "their-salt" not in str(salts)
    assert all(b["input"] == document and b["model"] == "m" for b in bodies)


def test_one_tenants_waiting_requests_leave_the_other_tenants_room_in_the_queue(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    """The pool's one backend (one slot) holds two of `acme`'s requests, so the pool is
    saturated for as long as the test holds them. `acme` then sends more: they filled the
    gateway's queue (size 2), and `other` was refused 429 for every request meanwhile.
    Now one tenant's requests take at most its part of the queue (half by default):
    `acme`'s second waiter is refused, `other`'s waits its turn and is served."""
    sim = start_sim("vllm", models=("m",), slots=1, zero_latency=True)
    gateway = start_gateway(
        [backend("gpu", sim.url, "m", capacity={"max_concurrency": 1})],
        scrape={"interval_s": 0.05, "timeout_s": 2.0, "staleness_s": 30.0},
        routing={"pools": {"m": {"queue": {"threshold": 0.5, "size": 2, "max_wait_s": 60}}}},
        tenants=TWO_TENANTS,
    )
    queue = gateway.app.proxy.router.queues["m"]
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}

    async def run() -> list[httpx.Response]:
        async with (
            httpx.AsyncClient(base_url=gateway.url, timeout=60) as held,
            httpx.AsyncClient(base_url=gateway.url, timeout=60) as http,
        ):

            def post(client: httpx.AsyncClient, key: str) -> asyncio.Task[httpx.Response]:
                headers = {"authorization": f"Bearer {key}"}
                request = client.post("/v1/chat/completions", json=body, headers=headers)
                return asyncio.create_task(request)

            sim.app.control.faults = Faults(hang_rate=1.0)
            holders = [post(held, TENANT_KEY), post(held, TENANT_KEY)]
            await until_async(lambda: sim.app.stats.hangs == 2, "both held by the backend")
            sim.app.control.faults = Faults()  # requests from now on are answered
            try:
                waiting = post(http, TENANT_KEY)
                await until_async(lambda: queue.waiting == 1, "acme's first waiter")
                second = post(http, TENANT_KEY)
                await until_async(
                    lambda: second.done() or queue.waiting == 2, "acme's second waits or not"
                )
                theirs = post(http, OTHER_KEY)
                await until_async(
                    lambda: theirs.done() or (second.done() and queue.waiting == 2),
                    "other's request waits or not",
                )
                assert not theirs.done(), (await theirs).text  # refused: the queue was acme's
            finally:
                for task in holders:  # their client leaves: the gateway drops them
                    task.cancel()
                await asyncio.gather(*holders, return_exceptions=True)
            return [await waiting, await second, await theirs]

    waiting, second, theirs = asyncio.run(run())
    assert theirs.status_code == 200, theirs.text
    assert waiting.status_code == 200, waiting.text
    assert second.status_code == 429, second.text
    error = second.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and second.headers["retry-after"] == "1"
    assert "queue.size_per_tenant" in error["message"]
    assert queue.waiting == 0


def test_a_tenants_burst_in_the_queue_does_not_make_another_tenants_request_wait_behind_it(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    """The pool's one backend (one slot) holds two requests, and holds every request it
    gets (hang fault) until its client leaves, so each slot freed lets exactly one waiter
    through, and the backend sees the order of release. `acme` queues 4 requests, then
    `other` queues 1: the queue let them go first come, first served, so `other`'s went
    fifth, behind all of `acme`'s burst. Now the queue takes turns across tenants: it goes
    second. (Re-checks of the pool's load are every `scrape.interval_s`, 30 s here, so only
    the freed slots let waiters go.)"""
    sim = start_sim("vllm", models=("m",), slots=1, zero_latency=True)
    gateway = start_gateway(
        [backend("gpu", sim.url, "m", capacity={"max_concurrency": 1})],
        scrape={"interval_s": 30.0, "timeout_s": 2.0, "staleness_s": 60.0},
        routing={"pools": {"m": {"queue": {"threshold": 0.5, "size": 10, "max_wait_s": 60}}}},
        tenants=TWO_TENANTS,
    )
    queue = gateway.app.proxy.router.queues["m"]
    keys = {"acme": TENANT_KEY, "other": OTHER_KEY}

    def seen() -> list[str]:  # the label of each request the backend got, in order
        bodies = [orjson.loads(r.body) for r in sim.app.captured("/v1/chat/completions")]
        return [body["messages"][0]["content"] for body in bodies]

    def waiters_are(n: int) -> Callable[[], bool]:
        return lambda: queue.waiting == n

    def held_are(n: int) -> Callable[[], bool]:
        return lambda: sim.app.stats.hangs == n

    async def run() -> list[str]:
        tasks: dict[str, asyncio.Task[httpx.Response]] = {}

        async def post(label: str) -> httpx.Response:
            body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": label}]}
            headers = {"authorization": f"Bearer {keys[label.split()[0]]}"}
            async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
                return await client.post("/v1/chat/completions", json=body, headers=headers)

        sim.app.control.faults = Faults(hang_rate=1.0)
        try:
            for label in ("acme held-1", "acme held-2"):
                tasks[label] = asyncio.create_task(post(label))
            await until_async(held_are(2), "both held by the backend")
            burst = ["acme 1", "acme 2", "acme 3", "acme 4", "other 1"]
            for waiting, label in enumerate(burst, 1):
                tasks[label] = asyncio.create_task(post(label))
                await until_async(waiters_are(waiting), f"{label} waits")
            for freed in range(len(burst)):
                tasks[seen()[freed]].cancel()  # its client leaves: a slot frees
                await until_async(
                    held_are(3 + freed),
                    "one waiter let through to the backend",
                    detail=seen,
                )
            assert queue.waiting == 0 and sim.app.stats.hangs == 2 + len(burst), seen()
            return seen()[2:]
        finally:
            for task in tasks.values():  # every client leaves: the gateway drops them
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)

    assert asyncio.run(run()) == ["acme 1", "other 1", "acme 2", "acme 3", "acme 4"]
