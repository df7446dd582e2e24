"""The provenance log on the request path, over real sockets: records, receipts, proofs."""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway.provenance import (
    load_verifiers,
    verify_commitment,
    verify_log,
    verify_receipt,
    write_signing_key,
)
from gateway.serving import ServerThread
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    OTHER_KEY,
    Gateway,
    Sim,
    backend,
    gateway_config,
    hosted_backend,
    readiness,
)
from tests.helpers.provenance import batch_receipts, completion_record, records
from tests.helpers.waiting import until

CANARY = "CANARY-5c1b-provenance-never-stores-content"


@pytest.fixture(params=["batch", "single"])
def logged(
    start_sim: Callable[..., Sim], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Gateway, Sim, Path, str]]:
    """A gateway with the provenance log on, issuing batch (v2) or single (v1) receipts;
    yields (gateway, sim, log dir, verifier key)."""
    from gateway.app import create_app

    vkey = write_signing_key(tmp_path / "log.key", "test.owngate/log/1")
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = gateway_config(
        [backend("gpu", sim.url, "m")],
        provenance={
            "dir": "log",
            "origin": "test.owngate/log/1",
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 50,
            "receipts": request.param,
        },
    )
    app = create_app(config, environ={}, config_dir=tmp_path)
    server = ServerThread(app).start()
    try:
        yield Gateway(app, server), sim, tmp_path / "log", vkey
    finally:
        server.stop()


def test_every_request_is_logged_and_receipted(
    logged: tuple[Gateway, Sim, Path, str], tmp_path: Path
) -> None:
    gateway, _sim, log_dir, vkey = logged
    verifiers = load_verifiers([vkey])
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": CANARY}]})
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", content=body, headers=gateway.headers, timeout=10
    )
    assert response.status_code == 200
    envelope = base64.b64decode(response.headers["x-owngate-receipt"])
    receipt = verify_receipt(envelope, verifiers)
    # one request at a time: alone in its batch, its receipt is v1 in either mode
    assert "batch" not in orjson.loads(envelope) and "signatures" in orjson.loads(envelope)
    assert receipt.request_id == response.headers["x-request-id"]
    assert receipt.backend == "gpu"
    assert receipt.policy_digest == gateway.app.policies.current.digest

    # Streams carry the receipt as a final SSE comment; the official SDK ignores it.
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": CANARY}], stream=True, max_tokens=3
        )
    )
    client.close()
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 3
    raw = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        headers=gateway.headers,
        timeout=10,
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "max_tokens": 2,
        },
    )
    assert ": owngate-receipt " in raw.text

    # Retrievable later, by the same tenant only.
    again = httpx.get(
        f"{gateway.url}/v1/provenance/receipts/{receipt.request_id}",
        headers=gateway.headers,
        timeout=10,
    )
    assert again.content == envelope
    other = httpx.get(
        f"{gateway.url}/v1/provenance/receipts/{receipt.request_id}",
        headers={"authorization": f"Bearer {OTHER_KEY}"},
        timeout=10,
    )
    assert other.status_code == 404

    # A policy refusal is logged too (the other tenant may use no model).
    refused = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        timeout=10,
        headers={"authorization": f"Bearer {OTHER_KEY}"},
    )
    assert refused.status_code == 404  # unknown to that tenant: never reaches the policy

    # An inclusion proof once a checkpoint covers the dispatch record.
    proof_url = f"{gateway.url}/v1/provenance/proofs/{receipt.request_id}"
    until(
        lambda: httpx.get(proof_url, headers=gateway.headers, timeout=10).status_code == 200,
        "an inclusion proof",
        timeout=30.0,
        interval=0.05,
    )
    proof = httpx.get(proof_url, headers=gateway.headers, timeout=10)
    assert proof.status_code == 200
    assert proof.text.startswith("c2sp.org/tlog-proof@v1")
    elsewhere = httpx.get(
        f"{gateway.url}/v1/provenance/proofs/{receipt.request_id}",
        headers={"authorization": f"Bearer {OTHER_KEY}"},
        timeout=10,
    )
    assert elsewhere.status_code == 404  # proofs, like receipts, only for the same tenant

    # What the log added before each dispatch is on /metrics: three requests went upstream.
    scraped = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert "owngate_provenance_dispatch_wait_seconds_count 3.0" in scraped

    gateway.server.stop()  # a final checkpoint is signed on shutdown
    summary = verify_log(log_dir, verifiers)
    assert summary.unsigned_entries == 0 and summary.open_dispatches == 0
    logged_records = records(log_dir)
    kinds = [r["type"] for r in logged_records]
    assert kinds.count("dispatch") == kinds.count("completion") == 3
    first = logged_records[0]
    assert first["request_id"] == receipt.request_id
    assert first["backend"]["id"] == "gpu"
    verify_commitment("request", str(first["request_commitment"]), receipt.salts.request, body)
    completion = next(r for r in logged_records if r["type"] == "completion")
    assert completion["status"] == 200 and completion["usage"] is not None
    for file in log_dir.rglob("*"):
        if file.is_file():
            assert CANARY.encode() not in file.read_bytes()
    audit = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "verify", str(log_dir), "--key", vkey],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_concurrent_requests_share_signed_batches(
    logged: tuple[Gateway, Sim, Path, str],
) -> None:
    """With `receipts: batch`, requests whose dispatch records share a committed batch get
    batch receipts (v2), each verifying on its own; with `single`, never."""
    gateway, _sim, log_dir, vkey = logged
    verifiers = load_verifiers([vkey])
    ask = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    url = f"{gateway.url}/v1/chat/completions"

    def send() -> httpx.Response:
        return httpx.post(url, headers=gateway.headers, json=ask, timeout=10)

    if gateway.app.config.provenance.receipts == "single":  # type: ignore[union-attr]
        with pytest.raises(AssertionError, match="no batch receipt"):
            batch_receipts(send, rounds=2)
        return
    found = batch_receipts(send)
    for answer, envelope in found:
        assert verify_receipt(envelope, verifiers).request_id == answer.headers["x-request-id"]
        looked_up = httpx.get(  # the lookup serves the same batch receipt
            f"{gateway.url}/v1/provenance/receipts/{answer.headers['x-request-id']}",
            headers=gateway.headers,
            timeout=10,
        )
        assert looked_up.status_code == 200 and looked_up.content == envelope
    statements = {orjson.loads(envelope)["batch"]["payload"] for _, envelope in found}
    assert len(statements) < len(found)  # some share one signature
    assert verify_log(log_dir, verifiers).size > 0


def test_refusals_are_logged(start_sim: Callable[..., Sim], tmp_path: Path) -> None:
    from gateway.app import create_app

    vkey = write_signing_key(tmp_path / "log.key", "test.owngate/log/2")
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    (policy_dir / "p.yaml").write_text(
        "apiVersion: policy.owngate.dev/v1\nkind: Policy\nmetadata: {id: eu-only}\n"
        "spec:\n  tenants: [acme]\n  residency: {allow: [eu]}\n  retention: {max_days: any}\n"
        "  fallback: {mode: never}\n"
    )
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = gateway_config(
        [backend("gpu-us", sim.url, "m", region="us-east-1")],
        policy={"paths": ["policies"]},
        provenance={"dir": "log", "origin": "test.owngate/log/2", "signing_key_file": "log.key"},
    )
    with ServerThread(create_app(config, environ={}, config_dir=tmp_path)) as server:
        gateway = Gateway(None, server)  # type: ignore[arg-type]
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            headers=gateway.headers,
            json={"model": "m", "messages": []},
            timeout=10,
        )
        # `m` is not in acme's `/v1/models`: the 404 of a model that does not exist; the
        # refusal record keeps the rule that refused it.
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"
    verify_log(tmp_path / "log", load_verifiers([vkey]))
    (refusal,) = records(tmp_path / "log")
    assert refusal["type"] == "refusal"
    assert refusal["rule"] == "eu-only/residency"
    assert sim.app.captured("/v1/chat/completions") == []


def test_gateway_refuses_to_start_without_its_signing_key(tmp_path: Path) -> None:
    from gateway.app import create_app

    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")],
        provenance={"dir": "log", "origin": "x/log", "signing_key_file": "missing.key"},
    )
    with pytest.raises(RuntimeError, match="failed to start"):
        ServerThread(create_app(config, environ={}, config_dir=tmp_path)).start()


def test_an_unwritable_log_refuses_requests_then_recovers_without_traffic(
    logged: tuple[Gateway, Sim, Path, str],
) -> None:
    gateway, sim, log_dir, vkey = logged
    log = gateway.app.proxy.recorder.log  # type: ignore[union-attr]
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{gateway.url}/v1/chat/completions"
    assert httpx.post(url, headers=gateway.headers, json=ask, timeout=10).status_code == 200

    def signed_all() -> bool:  # the checkpoint's snapshot closed the write-ahead segment
        latest = log.latest_checkpoint()
        signed = log.size == 2 and latest is not None and latest.checkpoint.size == 2
        return signed and not list((log_dir / "wal").glob("*.wal"))  # export cleaned up

    until(signed_all, "a checkpoint signing both records, the WAL cleaned up")
    wal = log_dir / "wal"
    shutil.rmtree(wal)
    wal.write_bytes(b"")  # a file where the segment directory must be: every write fails
    sent = len(sim.app.captured("/v1/chat/completions"))

    refused = httpx.post(url, headers=gateway.headers, json=ask, timeout=10)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "provenance_unavailable"
    assert len(sim.app.captured("/v1/chat/completions")) == sent  # nothing went upstream
    ready = httpx.get(f"{gateway.url}/readyz", timeout=10)
    assert ready.status_code == 503
    provenance = readiness(gateway.url)["provenance"]
    assert provenance["writable"] is False
    assert provenance["detail"].startswith("cannot append to the provenance log: ")

    wal.unlink()  # the disk is back; no request comes (a replica that is not ready gets none)
    until(lambda: httpx.get(f"{gateway.url}/readyz", timeout=10).status_code == 200, "ready")
    served = httpx.post(url, headers=gateway.headers, json=ask, timeout=10)
    assert served.status_code == 200
    receipt = verify_receipt(
        base64.b64decode(served.headers["x-owngate-receipt"]), load_verifiers([vkey])
    )
    assert receipt.index == 2  # the refused request left nothing in the log
    until(lambda: log.size == 4, "four records")


def test_a_hosted_answer_records_the_providers_ids(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """A hosted provider cannot countersign: its completion record keeps the answer's id
    (and allow-listed request-id headers) to reconcile with the provider's usage export."""
    hosted = start_sim("vllm", models=("f",), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    write_signing_key(tmp_path / "log.key", "gw.test/hosted")
    gateway = start_gateway(
        [hosted_backend("hosted", f"{hosted.url}/v1", "f")],
        environ={"HOSTED_KEY": "sk-test"},
        policy={"paths": [str(tmp_path / "policies")]},
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": "gw.test/hosted",
            "signing_key_file": str(tmp_path / "log.key"),
            "checkpoint_interval_ms": 20,
        },
    )
    body = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 200, response.text
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["upstream"]["response_id"] == response.json()["id"]
    assert "attestation" not in record
