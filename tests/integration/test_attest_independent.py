"""Issue 15, layer 3, checked by an auditor who holds only public keys and does not run
owngate's code: the gateway's log and the sidecar's log are read with the independent
C2SP verifier (tests/helpers/c2sp_verifier.py), and every countersignature the gateway's
completion records carry is verified with the sidecar's Ed25519 key over the DSSE PAE of
the statement the sidecar's log holds, entry for entry (that statement names the
dispatch's request commitment and the completion's response commitment). A statement in
the sidecar's log the gateway's log does not carry is a request that bypassed it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from cryptography.exceptions import InvalidSignature

from gateway.provenance import load_signer
from gateway.provenance.formats.attestation import Statement, sign_statement
from gateway.provenance.testing import seeded_signer
from tests.helpers.attest import CHAT, served_chats, start_sidecar
from tests.helpers.c2sp_verifier import from_directory, note_key, read_log
from tests.helpers.gateways import Gateway, Sim, backend, logged_gateway

ORIGIN = "gw.test/independent"
PAYLOAD_TYPE = b"application/vnd.owngate.attestation+json"


def _pae(payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding, written out here from the DSSE spec."""
    return b"DSSEv1 %d %s %d %s" % (len(PAYLOAD_TYPE), PAYLOAD_TYPE, len(payload), payload)


def _jcs(value: dict[str, object]) -> bytes:
    """RFC 8785 for a statement (ASCII strings and integers only)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def test_an_independent_auditor_matches_the_two_logs_statement_by_statement(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    sidecar = start_sidecar(tmp_path, "gpu", sim.url)
    try:
        gateway = logged_gateway(
            start_gateway,
            tmp_path,
            [backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})],
            ORIGIN,
        )
        ids = served_chats(gateway, tmp_path / "log", 4)
        bypass = httpx.post(f"{sidecar.url}/v1/chat/completions", json=CHAT, timeout=30)
        assert bypass.status_code == 200
    finally:
        assert sidecar.stop() == 0

    log_key = note_key(load_signer(tmp_path / "log.key").vkey)
    sidecar_key = note_key(sidecar.vkey)
    key_id = f"{sidecar_key.name}+{sidecar_key.key_id.hex()}"
    _, gateway_entries = read_log(from_directory(tmp_path / "log"), [log_key], ORIGIN)
    _, sidecar_entries = read_log(from_directory(sidecar.log), [sidecar_key], "gpu")
    logged = {json.loads(entry)["counter"]: entry for entry in sidecar_entries}
    assert len(logged) == len(sidecar_entries) == 5  # four through the gateway, one past it

    records = [json.loads(entry) for entry in gateway_entries]
    dispatches = {i: r for i, r in enumerate(records) if r["type"] == "dispatch"}
    carried = set()
    for completion in (r for r in records if r["type"] == "completion"):
        attestation = completion["attestation"]
        assert attestation["failure"] is None and attestation["key"] == key_id
        dispatch = dispatches[completion["dispatch"]["index"]]
        statement = {
            "v": 1,
            "type": "attestation",
            "request_id": completion["request_id"],
            "time": attestation["time"],
            "counter": attestation["counter"],
            "key": attestation["key"],
            "request_commitment": dispatch["request_commitment"],
            "response_commitment": completion["response_commitment"],
        }
        payload = _jcs(statement)
        assert logged[attestation["counter"]] == payload  # the sidecar's own entry, byte for byte
        sidecar_key.public.verify(base64.b64decode(attestation["sig"]), _pae(payload))
        carried.add(attestation["counter"])
    assert len(carried) == 4
    (past,) = set(logged) - carried
    assert json.loads(logged[past])["request_id"] not in ids
    assert not any(r["request_id"] == json.loads(logged[past])["request_id"] for r in records)


@pytest.mark.parametrize("field", ["request_commitment", "response_commitment", "request_id"])
def test_the_independent_check_fails_on_a_changed_field(field: str) -> None:
    """The check above can fail: a statement with one field changed no longer verifies."""
    signer = seeded_signer("gpu")
    statement = Statement("req_1", "2026-01-01T00:00:00.000Z", 0, str(signer), "a" * 64, "b" * 64)
    envelope = json.loads(sign_statement(statement, signer))
    record = dict(statement.record())
    record[field] = "c" * 64 if field != "request_id" else "req_2"
    key = note_key(signer.vkey)
    with pytest.raises(InvalidSignature):
        key.public.verify(base64.b64decode(envelope["signatures"][0]["sig"]), _pae(_jcs(record)))
    key.public.verify(
        base64.b64decode(envelope["signatures"][0]["sig"]), _pae(_jcs(statement.record()))
    )
