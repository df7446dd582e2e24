"""`owngate audit receipt verify` names the key that verified a receipt, and refuses a
receipt claiming a log whose key (given) did not sign it.

Before, without `--log` it printed "signed by the log <receipt.log>": the receipt's own
claim, whatever trusted key signed it. An auditor of several replicas passes each one's
key (each named for its replica's origin, docs/provenance.md "Keys"); replica A's key could
sign a receipt saying it is of replica B's log, and it verified as B's. Now a receipt
whose log has a key among those given must be signed by a key of that name; a receipt
whose log no given key is named for verifies naming the key, with a note that its log
claim is not checked without `--log`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.provenance import Receipt, Salts, make_receipt
from gateway.provenance.formats.note import Signer
from gateway.provenance.testing import EXAMPLE_POLICY, CountingRandom, seeded_signer
from tests.helpers.provenance import run_audit

REPLICA_A = seeded_signer("gateway.example/log/replica-a", seed=3)
REPLICA_B = seeded_signer("gateway.example/log/replica-b", seed=4)
UNNAMED = seeded_signer("gateway-signing-key", seed=5)  # a key not named for its log


def _receipt(tmp_path: Path, log: str, signer: Signer) -> str:
    receipt = Receipt(
        request_id="req-1",
        log=log,
        index=0,
        dispatch_hash=bytes(32),
        backend="gpu-a",
        policy_digest=EXAMPLE_POLICY.digest,
        salts=Salts.generate(CountingRandom("log-key")),
    )
    path = tmp_path / "receipt.json"
    path.write_bytes(make_receipt(receipt, signer))
    return str(path)


def _verify(receipt: str, *signers: Signer) -> int:
    keys = [argument for signer in signers for argument in ("--key", signer.vkey)]
    return run_audit(["receipt", "verify", receipt, *keys])


def test_a_replicas_key_cannot_vouch_for_another_replicas_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = _receipt(tmp_path, REPLICA_B.name, REPLICA_A)
    assert _verify(forged, REPLICA_A, REPLICA_B) == 1
    captured = capsys.readouterr()
    assert "ok: receipt" not in captured.out
    assert "another log's key signed it" in captured.err, captured.err
    assert str(REPLICA_A.verifier()) in captured.err


def test_a_receipt_names_the_key_that_signed_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    genuine = _receipt(tmp_path, REPLICA_B.name, REPLICA_B)
    assert _verify(genuine, REPLICA_A, REPLICA_B) == 0
    out = capsys.readouterr().out
    assert f"of the log {REPLICA_B.name} signed by the key {REPLICA_B.verifier()}:" in out, out
    assert "the receipt's own claim" not in out


def test_a_key_not_named_for_the_log_says_the_claim_is_unchecked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    receipt = _receipt(tmp_path, REPLICA_B.name, UNNAMED)
    assert _verify(receipt, UNNAMED) == 0
    out = capsys.readouterr().out
    assert f"signed by the key {UNNAMED.verifier()}" in out
    assert "the receipt's own claim, not checked: add --log LOGDIR" in out, out


def test_proof_verify_refuses_the_receipt_of_another_logs_key_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = _receipt(tmp_path, REPLICA_B.name, REPLICA_A)
    (tmp_path / "proof").write_text("not read: the receipt is refused first\n")
    keys = ["--key", REPLICA_A.vkey, "--key", REPLICA_B.vkey]
    assert run_audit(["proof", "verify", str(tmp_path / "proof"), *keys, "--receipt", forged]) == 1
    captured = capsys.readouterr()
    assert "ok: receipt" not in captured.out
    assert "another log's key signed it" in captured.err, captured.err
