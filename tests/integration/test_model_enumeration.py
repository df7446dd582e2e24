"""A tenant cannot learn the names of models its `/v1/models` does not list (a red-team
pass, kept as regressions).

`acme`'s policy denies `globex-merger-ft`, another tenant's fine-tune served by the same
backend: its `/v1/models` lists `m` alone. Asking for `globex-merger-ft` was 403 "policy
p/models: no backend may serve model 'globex-merger-ft'...", asking for a made-up name
404: the difference named the other tenant's models. Now both are the same 404, on every
proxied endpoint, streaming or not, receipt and all, no backend contacted; the signed log
keeps the rule that refused each. A model `acme` sees keeps its 403 naming the rule.
The provenance log is on: every answer carries a receipt, which is part of the answer.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.canonical import canonical_json
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.receipts import receipt_claims
from tests.helpers.gateways import TENANT_KEY, Gateway, Sim, backend, logged_gateway
from tests.helpers.provenance import request_records

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "1"}
spec:
  tenants: [acme]
  models: {deny: [globex-merger-ft]}
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
  data_classes:
    secret: {models: {deny: [m]}}
"""
HIDDEN = "globex-merger-ft"  # configured, denied by acme's policy
NONE = "globex-mergex-ft"  # served by no backend (as long: the bodies compare byte for byte)
# What differs between any two answers: the request, and when it was answered.
_PER_REQUEST = {"x-request-id", "date", "x-owngate-receipt"}

Rig = tuple[Gateway, Sim, Path]


@pytest.fixture
def rig(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> Rig:
    sim = start_sim("vllm", models=("m", HIDDEN), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICY)
    gateway = logged_gateway(
        start_gateway,
        tmp_path,
        [backend("gpu", sim.url, "m", HIDDEN)],
        "gw.test/models",
        policy={"paths": [str(tmp_path / "policies")]},
    )
    return gateway, sim, tmp_path / "log"


def ask(gateway: Gateway, path: str, model: str, **extra: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {TENANT_KEY}", **extra.pop("headers", {})}
    body: dict[str, Any] = {"model": model, **extra}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    elif path == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body["input"] = "hi"
    return httpx.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=30)


def answer(response: httpx.Response, model: str) -> tuple[int, bytes, list[tuple[str, str]]]:
    """The answer as the client reads it, less what differs per request."""
    request_id = response.headers["x-request-id"]
    body = response.content.replace(request_id.encode(), b"REQ").replace(model.encode(), b"M")
    headers = [(k, "*" if k in _PER_REQUEST else v) for k, v in response.headers.items()]
    return response.status_code, body, headers


@pytest.mark.parametrize(
    ("path", "extra", "rule"),
    [
        ("/v1/chat/completions", {}, "p/models"),
        ("/v1/chat/completions", {"stream": True}, "p/models"),
        ("/v1/completions", {}, "p/models"),
        ("/v1/completions", {"stream": True}, "p/models"),
        ("/v1/embeddings", {}, "p/models"),
        ("/v1/chat/completions", {"headers": {"x-data-class": "secret"}}, "p/models"),
        # A label the policy does not define: 400 for a model the tenant sees, and no
        # word of the label's rule here either.
        ("/v1/chat/completions", {"headers": {"x-data-class": "nosuch"}}, "p/data_classes"),
    ],
)
def test_a_hidden_model_is_answered_as_one_that_does_not_exist(
    rig: Rig, path: str, extra: dict[str, Any], rule: str
) -> None:
    """A configured model the tenant's policy denies got 403 naming the rule, model and
    tenant, a made-up one 404 (and no receipt): the tenant could enumerate the names of
    other tenants' models. Now the answers are byte for byte the same, headers and
    receipt included, and neither reached the backend; the signed log's refusal records
    keep what refused each."""
    gateway, sim, log = rig
    listed = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers, timeout=10)
    assert [m["id"] for m in listed.json()["data"]] == ["m"]
    hidden = ask(gateway, path, HIDDEN, **extra)
    none = ask(gateway, path, NONE, **extra)
    assert hidden.status_code == 404, hidden.text
    assert hidden.json()["error"]["code"] == "model_not_found"
    assert answer(hidden, HIDDEN) == answer(none, NONE)
    assert "x-owngate-receipt" in hidden.headers and "x-owngate-receipt" in none.headers
    assert [r for r in sim.app.captured() if r.method == "POST"] == []
    (refused,) = request_records(log, hidden.headers["x-request-id"], "refusal")
    assert (refused["rule"], refused["reason"], refused["model"]) == (
        rule,
        "model_not_found",
        HIDDEN,
    )
    (unknown,) = request_records(log, none.headers["x-request-id"], "refusal")
    assert unknown["rule"].endswith("/unknown-model") and unknown["reason"] == "model_not_found"
    assert NONE not in str(unknown)


def test_a_visible_model_refused_for_its_data_class_keeps_its_403(rig: Rig) -> None:
    """`m` is in acme's `/v1/models`: a request for it that its data class refuses is
    still 403 `policy_denied` naming the rule (the tenant knows the model exists, and the
    rule tells it why)."""
    gateway, sim, log = rig
    response = ask(gateway, "/v1/chat/completions", "m", headers={"x-data-class": "secret"})
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "policy_denied"
    assert error["message"].startswith("policy p/data_classes.secret/models: ")
    assert "'m'" in error["message"]
    (refused,) = request_records(log, response.headers["x-request-id"], "refusal")
    assert refused["reason"] == "policy_denied"
    assert [r for r in sim.app.captured() if r.method == "POST"] == []


def test_models_by_id_is_the_same_404_for_every_name(rig: Rig) -> None:
    """`GET /v1/models/{id}` is not served: a hidden model's id and a made-up one get the
    same 404 `not_found`, so it tells nothing either."""
    gateway, _, _ = rig
    answers = [
        httpx.get(f"{gateway.url}/v1/models/{name}", headers=gateway.headers, timeout=10)
        for name in (HIDDEN, NONE)
    ]
    assert [a.status_code for a in answers] == [404] * 2
    assert answer(answers[0], HIDDEN) == answer(answers[1], NONE)


def test_the_receipt_confirms_no_guess_of_an_unknown_models_record(rig: Rig) -> None:
    """The receipt names its record's leaf hash, and the refusal record of a model no
    backend serves held nothing the tenant could not know or guess (its request id, its
    tenant, `<unknown>`, the set's `unknown-model` rule and the policy a calibrating
    request shows, a time to the millisecond, the commitment its receipt's salts open):
    hashing that guess matched the receipt for a made-up name and not for a hidden one,
    which told the two apart all the same. A 404's record now holds 32 random bytes
    (`blind`) that no answer gives."""
    gateway, _, log = rig
    none = ask(gateway, "/v1/chat/completions", NONE)
    hidden = ask(gateway, "/v1/chat/completions", HIDDEN)
    blinds = []
    for response in (none, hidden):
        assert response.status_code == 404, response.text
        claims = receipt_claims(base64.b64decode(response.headers["x-owngate-receipt"]))
        (record,) = request_records(log, response.headers["x-request-id"], "refusal")
        assert leaf_hash(canonical_json(record)) == claims.dispatch_hash  # the record named
        guess = {key: value for key, value in record.items() if key != "blind"}
        assert leaf_hash(canonical_json(guess)) != claims.dispatch_hash
        blinds.append(record["blind"])
    assert len(set(blinds)) == 2 and all(len(b) == 64 for b in blinds)


@pytest.mark.parametrize(
    ("label", "status", "reason"),
    [("secret", 403, "policy_denied"), ("nosuch", 400, "unknown_data_class")],
)
def test_the_receipt_confirms_no_guess_of_the_backends_a_refusal_judged(
    rig: Rig, label: str, status: int, reason: str
) -> None:
    """A refusal of a model the tenant sees names the rule, never the backends it judged
    (tests/integration/test_error_disclosure.py), but its record's trace does (every
    backend serving the model, each with its verdict and rule). Everything else in the
    record the tenant knows or can guess (its request id, its tenant and the policy the
    403 names, the rule, a time to the millisecond, the commitment its salts open), so
    hashing its guess of the trace against the receipt's leaf hash confirmed which backends
    serve the model: the record of a guess `[gpu excluded by <rule>]` matched. Every
    refusal record now holds `blind`, 32 random bytes no answer gives."""
    gateway, _, log = rig
    response = ask(gateway, "/v1/chat/completions", "m", headers={"x-data-class": label})
    assert response.status_code == status, response.text
    claims = receipt_claims(base64.b64decode(response.headers["x-owngate-receipt"]))
    (record,) = request_records(log, response.headers["x-request-id"], "refusal")
    assert record["reason"] == reason
    assert record["trace"] == [{"backend": "gpu", "verdict": "excluded", "rule": record["rule"]}]
    assert leaf_hash(canonical_json(record)) == claims.dispatch_hash  # the record named
    guess = {key: value for key, value in record.items() if key != "blind"}
    assert leaf_hash(canonical_json(guess)) != claims.dispatch_hash
    assert len(record["blind"]) == 64
