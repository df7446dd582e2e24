"""`POST /admin/v1/receipts/verify` applies the CLI's log-name/key-name rule
(`receipt_keys.check_receipt_log_key`, the one function both call).

Before, the admin check accepted a receipt claiming this log's origin that a key named for
another log signed, as long as the log trusted that key (a previous signing key that
cosigned the checkpoints in a rotation, a retired verifier key): `owngate audit receipt
verify` with the same keys refused it ("another log's key signed it"), and so did `owngate
audit open --receipt --log` not (it opened the commitment). Now the admin verdict is
`valid: false` with that problem, `audit open` refuses it, and a receipt the log's own key
signed stays valid.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.admin.receipts import _check
from gateway.provenance import ProvenanceLog, make_receipt
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.formats.receipts import Receipt
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "gateway.example/log/primary"
SIGNER = seeded_signer(ORIGIN, seed=11)
OTHER = seeded_signer("gateway.example/log/replica-a", seed=12)  # named for another log


def _logged(path: Path) -> Receipt:
    """A log whose checkpoints both keys sign (OTHER as a cosigner, as a previous key in a
    rotation); the receipt of req-1, unsigned."""

    async def build() -> Receipt:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER, cosigners=[OTHER])
        logged = [await log_request(log, number) for number in range(2)]
        await log.close()
        return logged[1].receipt

    return asyncio.run(build())


def test_a_receipt_of_this_log_signed_by_another_logs_key_is_not_valid(tmp_path: Path) -> None:
    receipt = _logged(tmp_path / "log")
    keys = [SIGNER.verifier(), OTHER.verifier()]
    log = LogDirectory(tmp_path / "log")

    genuine = _check(make_receipt(receipt, SIGNER), log, keys)
    assert genuine["valid"] is True, genuine["problems"]

    forged = _check(make_receipt(receipt, OTHER), log, keys)
    assert forged["valid"] is False
    assert len(forged["problems"]) == 1
    assert "another log's key signed it" in forged["problems"][0], forged["problems"]
    assert forged["inclusion"]["checked"] is False


def test_audit_open_refuses_the_receipt_of_another_logs_key_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`owngate audit open --receipt --log` took the same receipt and opened the request
    commitment of the entry it names with it; now it refuses it as `receipt verify` does."""
    receipt = _logged(tmp_path / "log")
    body = tmp_path / "request.json"
    body.write_bytes(b'{"model":"m","messages":[]}')  # what log_request committed to
    keys = ["--key", SIGNER.vkey, "--key", OTHER.vkey]
    for signer, expected in ((SIGNER, 0), (OTHER, 1)):
        path = tmp_path / f"{signer.key_id}.json"
        path.write_bytes(make_receipt(receipt, signer))
        argv = ["open", str(body), "--receipt", str(path), "--log", str(tmp_path / "log")]
        assert run_audit([*argv, *keys]) == expected
    captured = capsys.readouterr()
    assert captured.out.count("opens the request commitment") == 1
    assert "another log's key signed it" in captured.err, captured.err
