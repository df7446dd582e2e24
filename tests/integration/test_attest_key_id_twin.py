"""Issue 15, layer 3, live: a verifier key with the right key id but another key.

A statement names its key by `name+hexid`, and the hex id is 32 bits of SHA-256, so a
second key with the id of the sidecar's can be found (tests/unit/test_attest_key_id_collision.py
holds such a pair, `gpu+63b2a5ae`). A real `owngate attest` holding one of the pair
countersigns; neither the gateway given the other key as `attest.key` nor `owngate audit
verify --backend-key` / `audit receipt verify --backend-key` given it may take the
statements for that key's: the key id matching is not the key matching.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.provenance import load_signer, write_signing_key
from tests.helpers.attest import Sidecar, start_sidecar
from tests.helpers.gateways import Gateway, Sim, backend, logged_gateway
from tests.helpers.provenance import completion_record, run_audit

ORIGIN = "gw.test/key-id-twin"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _seed(number: int) -> bytes:
    return hashlib.sha256(b"owngate-test-collision/%d" % number).digest()


def _twin_sidecar(start_sim: Callable[..., Sim], directory: Path) -> tuple[Sidecar, str]:
    """A sidecar holding the first key of the pair, and the pair's other verifier key."""
    directory.mkdir(parents=True)
    signing = write_signing_key(directory / "gpu.key", "gpu", random=lambda _: _seed(58093))
    other = directory / "other.key"
    twin = write_signing_key(other, "gpu", random=lambda _: _seed(63524))
    assert signing != twin and signing.split("+")[:2] == twin.split("+")[:2]
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    sidecar = start_sidecar(directory, "gpu", sim.url)  # keeps the key written above
    assert sidecar.vkey == signing
    return sidecar, twin


def _ask(gateway: Gateway) -> httpx.Response:
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return answer


def test_the_audit_refuses_a_backend_key_with_the_signers_id_but_another_key(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sidecar, twin = _twin_sidecar(start_sim, tmp_path / "sidecar")
    try:
        attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
        answer = _ask(gateway)
    finally:
        assert sidecar.stop() == 0
    request_id = answer.headers["x-request-id"]
    assert completion_record(tmp_path / "log", request_id)["attestation"]["sig"]
    receipt = tmp_path / "receipt.json"
    receipt.write_bytes(_receipt(answer))
    (tmp_path / "answer.json").write_bytes(answer.content)
    log_key = load_signer(tmp_path / "log.key").vkey
    log = ["verify", str(tmp_path / "log"), "--key", log_key]
    check = ["receipt", "verify", str(receipt), "--key", log_key, "--log", str(tmp_path / "log")]
    check += ["--response-body", str(tmp_path / "answer.json")]
    attest_log = ["--attest-log", f"gpu={sidecar.log}"]
    assert run_audit([*log, "--backend-key", f"gpu={sidecar.vkey}", *attest_log]) == 0
    assert run_audit([*check, "--backend-key", f"gpu={sidecar.vkey}"]) == 0
    capsys.readouterr()
    assert run_audit([*log, "--backend-key", f"gpu={twin}"]) == 1
    assert f"request {request_id!r} (backend gpu)" in capsys.readouterr().err
    assert run_audit([*log, "--backend-key", f"gpu={twin}", *attest_log]) == 1
    assert run_audit([*check, "--backend-key", f"gpu={twin}"]) == 1


def test_a_gateway_given_the_twin_key_takes_no_countersignature(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    sidecar, twin = _twin_sidecar(start_sim, tmp_path / "sidecar")
    try:
        attested = backend("gpu", sidecar.url, "m", attest={"key": twin})
        gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
        answer = _ask(gateway)
    finally:
        assert sidecar.stop() == 0
    assert "attestation" not in json.loads(_receipt(answer))
    attestation = completion_record(tmp_path / "log", answer.headers["x-request-id"])["attestation"]
    assert attestation["sig"] is None and attestation["failure"] == "bad_signature"
    log_key = load_signer(tmp_path / "log.key").vkey
    log = ["verify", str(tmp_path / "log"), "--key", log_key]
    assert run_audit([*log, "--backend-key", f"gpu={twin}"]) == 1


def _receipt(answer: httpx.Response) -> bytes:
    return base64.b64decode(answer.headers["x-owngate-receipt"])
