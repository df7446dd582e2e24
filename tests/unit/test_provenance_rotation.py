"""A key retired by a rotation must not sign the log alone again (audit.rotation).

The rotation in docs/provenance.md ("Keys") goes A, A+B, B. Someone who kept the old key
A (and not B) can append entries and sign a checkpoint with A alone; an auditor given
both keys used to accept it, since every checkpoint needed only one trusted signature.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.provenance import (
    LogDirectory,
    LogVerificationError,
    ProvenanceLog,
    Signer,
    make_receipt,
    verify_log,
    verify_receipt,
)
from gateway.provenance.audit.receipt_keys import check_receipt_key
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "test.owngate/rotation-order"


def _phase(directory: Path, signer: Signer, cosigners: Sequence[Signer], request: int) -> None:
    # Every key of these tests is listed as retired, so the writer goes on from a checkpoint
    # any of them signed (a straight hand-over; someone holding a retired key): what these
    # tests check is what the auditor's verify makes of the log.
    retired = [seeded_signer(ORIGIN, n).verifier() for n in (1, 2, 3)]

    async def run() -> None:
        log = await ProvenanceLog.open(
            directory, ORIGIN, signer, cosigners=cosigners, retired=retired
        )
        await log_request(log, request)
        await log.close()

    asyncio.run(run())


def test_a_checkpoint_by_the_retired_key_alone_after_the_rotation_is_refused(
    tmp_path: Path,
) -> None:
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
    keys = [old.verifier(), new.verifier()]
    _phase(tmp_path, old, [], 0)  # before: A
    _phase(tmp_path, new, [old], 1)  # the overlap: A+B
    _phase(tmp_path, new, [], 2)  # after: B
    assert verify_log(tmp_path, keys).size == 6  # the documented rotation verifies
    _phase(tmp_path, old, [], 3)  # the retired key signs alone again
    with pytest.raises(LogVerificationError, match="retired by a rotation"):
        verify_log(tmp_path, keys)


def test_going_back_to_the_old_key_after_the_overlap_is_refused(tmp_path: Path) -> None:
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
    _phase(tmp_path, old, [], 0)
    _phase(tmp_path, new, [old], 1)
    _phase(tmp_path, old, [], 2)  # A only, after B had signed
    with pytest.raises(LogVerificationError, match="retired by a rotation"):
        verify_log(tmp_path, [old.verifier(), new.verifier()])


def test_a_rotation_without_overlap_and_a_second_rotation_verify(tmp_path: Path) -> None:
    first, second, third = (seeded_signer(ORIGIN, n) for n in (1, 2, 3))
    _phase(tmp_path, first, [], 0)
    _phase(tmp_path, second, [], 1)  # straight hand-over (no overlap)
    _phase(tmp_path, third, [second], 2)
    _phase(tmp_path, third, [], 3)
    keys = [first.verifier(), second.verifier(), third.verifier()]
    assert verify_log(tmp_path, keys).size == 8
    # Only the newest key, told the log rotated: the earlier checkpoints are skipped.
    assert verify_log(tmp_path, [third.verifier()], accept_earlier_keys=True).size == 8


def test_a_checkpoint_saved_before_the_rotation_needs_the_old_key(tmp_path: Path) -> None:
    # docs/provenance.md, "Auditing with independent tools": yesterday's checkpoint,
    # signed by the old key, proves today's log extends it only with the old key given.
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
    _phase(tmp_path, old, [], 0)
    yesterday = (tmp_path / "checkpoint").read_bytes()
    _phase(tmp_path, new, [old], 1)
    _phase(tmp_path, new, [], 2)
    with pytest.raises(LogVerificationError, match="trusted checkpoint #1"):
        verify_log(
            tmp_path, [new.verifier()], accept_earlier_keys=True, trusted_checkpoints=[yesterday]
        )
    both = [old.verifier(), new.verifier()]
    assert verify_log(tmp_path, both, trusted_checkpoints=[yesterday]).size == 6


def test_a_receipt_verifies_with_the_key_the_log_had_when_its_entry_was_written(
    tmp_path: Path,
) -> None:
    """`check_receipt_key` (receipt verify --log, the admin API): each phase's receipts
    verify with their own key, the overlap's with B; A signing a receipt for an entry
    written after the rotation (the same payload, re-signed) is refused, and so is B
    signing one for an entry written before it."""
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
    keys = [old.verifier(), new.verifier()]
    receipts = {}

    async def run(number: int, signer: Signer, cosigners: Sequence[Signer]) -> None:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, signer, cosigners=cosigners)
        logged = await log_request(log, number)
        receipts[number] = (logged.receipt, make_receipt(logged.receipt, signer))
        await log.close()

    for number, (signer, cosigners) in enumerate(((old, []), (new, [old]), (new, []))):
        asyncio.run(run(number, signer, cosigners))
    log = LogDirectory(tmp_path)
    for _, envelope in receipts.values():
        check_receipt_key(log, envelope, verify_receipt(envelope, keys), keys)
    late, _ = receipts[2]
    forged = make_receipt(late, old)
    with pytest.raises(LogVerificationError, match="a key retired by a rotation signed it"):
        check_receipt_key(log, forged, verify_receipt(forged, keys), keys)
    early, _ = receipts[0]
    backdated = make_receipt(early, new)
    with pytest.raises(LogVerificationError, match="not the log's key when the entry"):
        check_receipt_key(log, backdated, verify_receipt(backdated, keys), keys)


def test_receipt_verify_with_both_keys_and_no_log_says_the_rotation_rule_was_not_applied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the log's history no verifier can tell a receipt the retired key signed
    before the rotation from one it signed after (an independent verifier given both keys
    accepts both, as owngate does). `receipt verify` passed such a forgery with a bare
    `ok`; given more than one key and no --log it now says what it did not check."""
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)

    async def run() -> bytes:
        log = await ProvenanceLog.open(tmp_path / "log", ORIGIN, new)
        logged = await log_request(log, 0)
        await log.close()
        return make_receipt(logged.receipt, old)  # the retired key, after its retirement

    (tmp_path / "r.json").write_bytes(asyncio.run(run()))
    keys = ["--key", old.vkey, "--key", new.vkey]
    assert run_audit(["receipt", "verify", str(tmp_path / "r.json"), *keys]) == 0
    assert "no --log: whether the key that signed this receipt" in capsys.readouterr().out
    assert run_audit(["receipt", "verify", str(tmp_path / "r.json"), "--key", old.vkey]) == 0
    assert "no --log" not in capsys.readouterr().out  # one key: nothing to choose between
    logged = [*keys, "--log", str(tmp_path / "log")]
    assert run_audit(["receipt", "verify", str(tmp_path / "r.json"), *logged]) == 1


def test_a_receipt_check_refuses_an_older_note_under_a_later_history_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check_receipt_key` picks the first history file covering the entry by its NAME.
    Whoever kept the retired key A put the overlap's note (size 4, signed A+B) under the
    name of B's checkpoint (size 6): A's re-signed receipt for entry 4, written after the
    rotation, was accepted. `audit verify` refuses such a file; so does the receipt
    check now, naming the file and both sizes."""
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
    keys = [old.verifier(), new.verifier()]
    receipts = {}

    async def run(number: int, signer: Signer, cosigners: Sequence[Signer]) -> None:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, signer, cosigners=cosigners)
        logged = await log_request(log, number)
        receipts[number] = logged.receipt
        await log.close()

    for number, (signer, cosigners) in enumerate(((old, []), (new, [old]), (new, []))):
        asyncio.run(run(number, signer, cosigners))
    history = tmp_path / "checkpoints"
    names = sorted(p.name for p in history.iterdir())
    assert [int(name) for name in names] == [0, 2, 4, 6], names
    late = receipts[2]
    assert late.index == 4
    forged = make_receipt(late, old)
    log = LogDirectory(tmp_path)
    with pytest.raises(LogVerificationError, match="retired by a rotation"):
        check_receipt_key(log, forged, verify_receipt(forged, keys), keys)
    (history / names[3]).write_bytes((history / names[2]).read_bytes())
    with pytest.raises(LogVerificationError, match=f"checkpoints/{names[3]} holds size 4, not 6"):
        check_receipt_key(log, forged, verify_receipt(forged, keys), keys)
    with pytest.raises(LogVerificationError, match="holds size 4, not 6"):
        verify_log(tmp_path, keys)  # the same refusal `audit verify` makes
    (tmp_path / "r.json").write_bytes(forged)
    capsys.readouterr()
    cli = ["--key", old.vkey, "--key", new.vkey, "--log", str(tmp_path)]
    assert run_audit(["receipt", "verify", str(tmp_path / "r.json"), *cli]) == 1
    assert "holds size 4, not 6" in capsys.readouterr().err
