"""A countersigned stream cut at the gateway's drain deadline after the sidecar's comment
was read (its countersignature judged and accepted, the stream's end still waiting on its
receipt). Its `data: [DONE]` had gone out: the client read the whole answer the statement
covers, so the cut ends the stream as its end would (its receipt line, carrying the
countersignature; no error event after `[DONE]`) and the record says 200, countersigned
(docs/provenance.md: "a countersigned stream is whole: the gateway writes nothing after
it but its receipt line"). Before, the gateway wrote its 503 error event after the
`[DONE]` no SDK reads and recorded 503 `missing`; and before that, the record (503) and
the client's receipt carried the countersignature while the client's bytes ended in the
error event, which its own `receipt verify --response-body` refused. (A countersigned
stream cut before any `[DONE]` still gets the error event and `missing`:
tests/integration/test_attest_left_at_done.py.) A real `owngate attest` sidecar in front of
a simulator.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest

from gateway.api.trail import Trail
from gateway.provenance import load_signer
from tests.helpers.attest import start_sidecar
from tests.helpers.gateways import Gateway, Sim, backend, logged_gateway
from tests.helpers.log_truth import CHAT, ORIGIN, salt_of, stream_receipt
from tests.helpers.provenance import completion_record, run_audit


def test_a_countersigned_stream_cut_at_drain_after_done_keeps_its_countersignature(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signing, released = threading.Event(), threading.Event()
    sealed = Trail.sealed_receipt

    async def held(trail: Trail) -> bytes | None:
        if not signing.is_set():  # the stream's end (its countersignature judged): held
            signing.set()
            await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
        return await sealed(trail)

    monkeypatch.setattr(Trail, "sealed_receipt", held)
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    sidecar = start_sidecar(tmp_path / "sidecar", "gpu-a", sim.url)
    try:
        served = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway = logged_gateway(
            start_gateway, tmp_path, [served], ORIGIN, limits={"drain_timeout_s": 0.001}
        )
        url = f"{gateway.url}/v1/chat/completions"
        with ThreadPoolExecutor(1) as pool:
            try:
                asked = pool.submit(httpx.post, url, json=CHAT, headers=gateway.headers, timeout=30)
                assert signing.wait(30)
                (task,) = list(gateway.app.serving)  # the request: its loop is the server's
                task.get_loop().call_soon_threadsafe(gateway.app.begin_drain)
                response = asked.result(30)
            finally:
                released.set()
    finally:
        assert sidecar.stop() == 0
    assert response.status_code == 200  # the head went out before the cut
    got = response.content
    body = got.partition(b": owngate-receipt ")[0]
    events = body.split(b"\n\n")
    assert events[-2] == b"data: [DONE]", events  # the backend's whole stream, nothing after
    assert b'"error"' not in body, body
    receipt = stream_receipt(got)
    assert "attestation" in json.loads(receipt)  # the client's, with the bytes it read
    request_id, _ = salt_of(receipt)
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (200, None), record
    assert record["attestation"]["failure"] is None and record["attestation"]["sig"], record
    # The metric says what the record says: one `ok`.
    counted = generate_latest(gateway.app.parts.metrics.registry).decode()
    assert 'owngate_attestations_total{backend="gpu",result="ok"} 1.0' in counted, counted
    assert 'result="missing"' not in counted, counted
    # What the client received opens the record's commitment, as a stream less the
    # gateway's receipt line, and the receipt is the log's.
    (tmp_path / "receipt").write_bytes(receipt)
    (tmp_path / "response").write_bytes(got)
    vkey = load_signer(tmp_path / "log.key").vkey
    check = ["receipt", "verify", str(tmp_path / "receipt"), "--key", vkey]
    assert run_audit([*check, "--log", str(tmp_path / "log")]) == 0
    opened = ["open", str(tmp_path / "response"), "--receipt", str(tmp_path / "receipt")]
    opened += ["--log", str(tmp_path / "log"), "--key", vkey, "--kind", "response"]
    assert run_audit(opened) == 0
    audit = ["verify", str(tmp_path / "log"), "--key", vkey, "--backend-key", f"gpu={sidecar.vkey}"]
    assert run_audit(audit) == 0
