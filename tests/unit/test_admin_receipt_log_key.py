"""`POST /admin/v1/receipts/verify` applies the CLI's log-name/key-name rule
(`receipt_keys.check_receipt_log_key`, the one function both call).

Before, the admin check accepted a receipt claiming this log's origin that a key named for
another log signed, as long as the log trusted that key (a previous signing key that
cosigned the checkpoints in a rotation, a retired verifier key): `owngate audit receipt
verify` with the same keys refused it ("another log's key signed it"). Now the admin
verdict is `valid: false` with that problem, and a receipt the log's own key signed stays
valid.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.admin.receipts import _check
from gateway.provenance import ProvenanceLog, make_receipt
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.formats.receipts import Receipt
from gateway.provenance.testing import log_request, seeded_signer

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
