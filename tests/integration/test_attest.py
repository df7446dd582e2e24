"""Two-party receipts end to end: a simulator, `owngate attest` sidecars (processes) and a
gateway on loopback, then `owngate audit verify --backend-key` on what they wrote, and on
logs rewritten as a compromised gateway or backend host could (docs/provenance.md,
layer 3). Each tamper case must be caught with a message naming what is wrong.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import write_signing_key
from tests.helpers.attest import Sidecar, rewrite_log, start_sidecar
from tests.helpers.gateways import Gateway, Sim, backend
from tests.helpers.provenance import completion_record, records, run_audit

ORIGIN = "gw.test/attest"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@pytest.fixture
def sim(start_sim: Callable[..., Sim]) -> Sim:
    return start_sim("vllm", models=("m",), zero_latency=True)


def _gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, backends: list[dict[str, Any]]
) -> Gateway:
    write_signing_key(tmp_path / "log.key", ORIGIN)
    provenance = {
        "dir": str(tmp_path / "log"),
        "origin": ORIGIN,
        "signing_key_file": str(tmp_path / "log.key"),
        "checkpoint_interval_ms": 20,
    }
    return start_gateway(backends, provenance=provenance)


def _attested(id: str, sidecar: Sidecar, key: str | None = None) -> dict[str, Any]:
    return backend(id, sidecar.url, "m", attest={"key": key or sidecar.vkey})


def _ask(gateway: Gateway, *, stream: bool = False, model: str = "m") -> httpx.Response:
    body = {**CHAT, "model": model, "stream": stream}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    return response


def _audit(tmp_path: Path, *extra: str, log: Path | None = None) -> int:
    key = str(tmp_path / "log.key")
    from gateway.provenance import load_signer

    return run_audit(["verify", str(log or tmp_path / "log"), "--key", load_signer(key).vkey, *extra])


def _key_id(vkey: str) -> str:
    return "+".join(vkey.split("+")[:2])


def _stream_receipt(text: str) -> bytes:
    line = next(line for line in text.splitlines() if line.startswith(": owngate-receipt "))
    return base64.b64decode(line.removeprefix(": owngate-receipt "))


def test_an_attested_answer_is_a_two_party_statement(
    sim: Sim,
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sidecar = start_sidecar(tmp_path, "gpu-a", sim.url)
    gateway = _gateway(start_gateway, tmp_path, [_attested("gpu", sidecar)])
    whole = _ask(gateway)
    streamed = _ask(gateway, stream=True)

    # The client's stream is the backend's, without the sidecar's comment line.
    assert ": owngate-attest" not in streamed.text
    assert "data: [DONE]" in streamed.text
    for response, receipt in (
        (whole, base64.b64decode(whole.headers["x-owngate-receipt"])),
        (streamed, _stream_receipt(streamed.text)),
    ):
        request_id = response.headers["x-request-id"]
        record = completion_record(tmp_path / "log", request_id)
        attestation = record["attestation"]
        assert attestation["failure"] is None and attestation["key"] == _key_id(sidecar.vkey)
        assert json.loads(receipt)["attestation"]["payloadType"].endswith("attestation+json")
        path = tmp_path / f"{request_id}.receipt"
        path.write_bytes(receipt)
        vkey = (tmp_path / "log.key").read_text()
        from gateway.provenance import load_signer

        assert run_audit(
            [
                "receipt", "verify", str(path), "--key", load_signer(tmp_path / "log.key").vkey,
                "--backend-key", f"gpu={sidecar.vkey}", "--log", str(tmp_path / "log"),
            ]
        ) == 0, vkey
        assert "countersigned by backend gpu's key" in capsys.readouterr().out

    assert sidecar.stop() == 0
    assert _audit(tmp_path, "--backend-key", f"gpu={sidecar.vkey}", "--attest-log", str(sidecar.log)) == 0
    out = capsys.readouterr().out
    assert "backend gpu: 2 answer(s) countersigned by its key; its sidecar's log (2 entries) agrees" in out
