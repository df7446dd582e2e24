"""A checkpoint of the log L is held to L's key when the auditor gives it.

An auditor of several replicas gives every replica's key (`--key A --key B`, or
`OWNGATE_AUDIT_KEY` listing them). A log's key is named for its origin (docs/provenance.md,
"Keys"), and a witness trusts a key only for the log its name is (gateway/provenance/
witness). Before, `audit verify` and `audit proof verify` took a checkpoint of replica
B's log that replica A's key alone had signed, B's key given and absent: `ok`, so A's key
could stand in for B's whole log (other entries, another history), while a receipt that
claimed B's log and was signed by A's key was already refused (`check_receipt_log_key`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.provenance.formats.note import Signer
from gateway.provenance.testing import seeded_signer, write_requests
from tests.helpers.provenance import run_audit_output

ORIGIN_A = "replica-a.example/log"
ORIGIN_B = "replica-b.example/log"
KEY_A = seeded_signer(ORIGIN_A)
KEY_B = seeded_signer(ORIGIN_B)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Replica B's log as B's key signs it, and one of B's origin A's key signed."""
    genuine = tmp_path_factory.mktemp("genuine")
    forged = tmp_path_factory.mktemp("forged")
    write_requests(genuine, ORIGIN_B, KEY_B, 2)
    write_requests(forged, ORIGIN_B, KEY_A, 2)
    return genuine, forged


def _keys(*signers: Signer) -> list[str]:
    return [part for signer in signers for part in ("--key", signer.vkey)]


def test_a_log_signed_by_another_logs_key_fails_verify(logs: tuple[Path, Path]) -> None:
    genuine, forged = logs
    code, out = run_audit_output(["verify", str(genuine), *_keys(KEY_A, KEY_B)])
    assert code == 0, out
    code, out = run_audit_output(["verify", str(forged), *_keys(KEY_A, KEY_B)])
    assert code == 1, out
    assert "another log's key signed it" in out
    assert ORIGIN_B in out
    # without a key named for the log, its origin is the checkpoint's own claim, as for a
    # receipt: the key that did sign it is named in the result
    code, out = run_audit_output(["verify", str(forged), *_keys(KEY_A)])
    assert code == 0, out
    assert f"signed by {ORIGIN_A}+" in out


def test_a_proof_against_another_logs_key_fails(
    logs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, forged = logs
    code, proof = run_audit_output(["prove", str(forged), "req-0"])
    assert code == 0, proof
    (tmp_path / "req.tlog-proof").write_text(proof[proof.index("c2sp.org/tlog-proof@v1") :])
    argv = ["proof", "verify", str(tmp_path / "req.tlog-proof")]
    code, out = run_audit_output([*argv, *_keys(KEY_A, KEY_B)])
    assert code == 1, out
    assert "another log's key signed it" in out
