"""A receipt check's rotation order (`audit.receipt_order`) verifies the checkpoints that
decide it, not every one below the receipt's entry, and a signature line a note claims
but that does not verify never counts.

Before, `check_receipt_key` verified the signatures of every history file below the
checkpoint covering the entry: about 200 us a file, minutes per receipt on a log of a
million checkpoints (docs/provenance.md, "Limits")."""

from __future__ import annotations

import base64
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.provenance import (
    LogDirectory,
    LogVerificationError,
    Signer,
    make_receipt,
    verify_receipt,
)
from gateway.provenance.audit import receipt_order
from gateway.provenance.audit.receipt_keys import check_receipt_key
from gateway.provenance.formats.checkpoint import Checkpoint, sign_checkpoint
from gateway.provenance.formats.commitments import Salts
from gateway.provenance.formats.layout import history_path
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.receipt_payload import Receipt
from gateway.provenance.testing import seeded_signer

ORIGIN = "test.owngate/receipt-order"
OLD, NEW = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
JUNK = seeded_signer("junk.example/x", 7)  # a key the auditor does not hold
REPLICA = seeded_signer("replica.example/log", 6)  # another log's key


class CountingVerifier(Verifier):
    """A verifier that counts the signatures it checks."""

    __slots__ = ("count",)

    def __init__(self, vkey: str) -> None:
        super().__init__(vkey)
        self.count = 0

    def verify(self, message: bytes, signature: bytes) -> None:
        self.count += 1
        super().verify(message, signature)


def _forged_line(signer: Signer) -> bytes:
    """A signature line naming `signer`'s key whose signature is not its."""
    blob = signer.key_id.to_bytes(4, "big") + bytes(64)
    return f"\u2014 {signer.name} {base64.b64encode(blob).decode()}\n".encode()


def _write_log(
    log: Path, signers: Sequence[Sequence[Signer]], forged: dict[int, Signer] | None = None
) -> None:
    """History files of sizes 1..len(signers), the one of size n signed by signers[n-1]
    (plus a forged line by forged[n]); the last is also the served checkpoint."""
    (log / "checkpoints").mkdir(parents=True)
    note = b""
    for size, keys in enumerate(signers, 1):
        note = sign_checkpoint(Checkpoint(ORIGIN, size, size.to_bytes(32, "big")), keys)
        if forged and size in forged:
            note += _forged_line(forged[size])
        history_path(log, size).write_bytes(note)
    (log / "checkpoint").write_bytes(note)


def _check(log: Path, index: int, signer: Signer, keys: Sequence[Verifier]) -> None:
    """`check_receipt_key` for a receipt `signer` signed for entry `index`."""
    receipt = Receipt("r-1", ORIGIN, index, bytes(32), "b", "d", Salts(bytes(32), bytes(32)))
    envelope = make_receipt(receipt, signer)
    check_receipt_key(LogDirectory(log), envelope, verify_receipt(envelope, keys), keys)


def test_a_receipt_check_verifies_the_checkpoints_that_decide_the_order_not_every_one(
    tmp_path: Path,
) -> None:
    """200 checkpoints around a rotation (A, A+B, B): the check verifies A's first, the
    overlap's first and the covering checkpoint (and the receipt), not 199 notes."""
    log = tmp_path / "log"
    _write_log(log, [[OLD]] * 99 + [[NEW, OLD]] * 3 + [[NEW]] * 98)
    keys = [CountingVerifier(OLD.vkey), CountingVerifier(NEW.vkey)]
    _check(log, 198, NEW, keys)  # covered first by the history file of size 199
    # A: its first checkpoint and the overlap's; B: the receipt (twice: `_check` parses
    # it), the overlap's first checkpoint and the covering one. Before: 102 each
    assert [key.count for key in keys] == [2, 4]


def _late_retired_key(stripped: int = 0) -> list[list[Signer]]:
    """A 1..9, A+B 10..11, B 12..19 and A alone at 20 (whoever kept A, after the
    rotation); A's lines taken off the first `stripped` checkpoints (JUNK signs them)."""
    history: list[list[Signer]] = [[OLD]] * 9 + [[NEW, OLD]] * 2 + [[NEW]] * 8 + [[OLD]]
    return [[JUNK]] * stripped + history[stripped:]


@pytest.mark.parametrize(
    ("forged_at", "stripped"),
    [(1, 0), (5, 4)],
    ids=["beside-the-first-checkpoint", "mid-history-after-stripped-ones"],
)
def test_a_forged_line_that_would_make_the_retired_key_current_does_not_count(
    tmp_path: Path, forged_at: int, stripped: int
) -> None:
    """A forged line by B beside A on a checkpoint A signed before the rotation (not the
    overlap, where B first signed), if trusted, puts B's first signature beside A's: A
    then reads as current with B, and its late checkpoint passes. The claim is verified,
    found forged, and the history read again verifying every note refuses it."""
    keys = [OLD.verifier(), NEW.verifier()]
    history = _late_retired_key(stripped)
    _write_log(tmp_path / "forged", history, forged={forged_at: NEW})
    with pytest.raises(LogVerificationError, match="retired by a rotation signed again"):
        _check(tmp_path / "forged", 19, OLD, keys)  # the entry A appended after the rotation
    _write_log(tmp_path / "plain", history)
    with pytest.raises(LogVerificationError, match="retired by a rotation signed again"):
        _check(tmp_path / "plain", 19, OLD, keys)  # the refusal the line would undo
    history[forged_at - 1] = [*history[forged_at - 1], NEW]  # the line, if it were B's
    _write_log(tmp_path / "trusted", history)
    _check(tmp_path / "trusted", 19, OLD, keys)  # accepted: the line decides


def _decision(log: Path, index: int, signer: Signer, keys: Sequence[Verifier]) -> str:
    try:
        _check(log, index, signer, keys)
    except LogVerificationError:
        return "refused"
    return "accepted"


def _forged_off_first_claims(
    history: Sequence[Sequence[Signer]], forged: dict[int, Signer], keys: Sequence[Verifier]
) -> bool:
    """Whether a forged line by a key of `keys` sits below the last checkpoint on a note
    that is not the first to claim that key (one the fast reading does not verify)."""
    trusted = {(key.name, key.key_id) for key in keys}
    first: dict[tuple[str, int], int] = {}
    for size, signers in enumerate(history[:-1], 1):
        claims = {(s.name, s.key_id) for s in signers}
        if size in forged:
            claims.add((forged[size].name, forged[size].key_id))
        for claim in claims & trusted:
            first.setdefault(claim, size)
    return any(
        size < len(history)
        and (line.name, line.key_id) in trusted
        and first[(line.name, line.key_id)] != size
        for size, line in forged.items()
    )


def test_the_checkpoints_verified_decide_as_verifying_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random small logs (keys of this log, another log's, one the auditor lacks; forged
    lines): the receipt check decides as it does verifying every checkpoint below the
    entry (`_claimed_below` off). The one difference: a forged line on a note that is no
    key's first claim is not read, so such a note is not refused as signed by no trusted
    key (`audit verify` refuses it); it moves no key's first signature."""
    rng = random.Random(20261207)
    pool, trusted = [OLD, NEW, JUNK, REPLICA], [OLD, NEW, REPLICA]
    seen: dict[tuple[str, str], int] = {}
    for case in range(400):
        history = [rng.sample(pool, rng.randint(1, 2)) for _ in range(rng.randint(2, 9))]
        forged = {
            size: rng.choice(trusted) for size in range(1, len(history) + 1) if rng.random() < 0.15
        }
        keys = [key.verifier() for key in rng.sample(trusted, rng.randint(1, 3))]
        held = [s for s in history[-1] if any(s.key_id == k.key_id for k in keys)]
        if not held:
            continue  # the receipt's key is not given: verify_receipt refuses it first
        log = tmp_path / str(case)
        _write_log(log, history, forged)
        args = (log, len(history) - 2, rng.choice(held), keys)
        fast = _decision(*args)
        with monkeypatch.context() as patched:
            patched.setattr(receipt_order, "_claimed_below", lambda *_: None)
            full = _decision(*args)
        seen[fast, full] = seen.get((fast, full), 0) + 1
        if fast != full:
            assert (fast, full) == ("accepted", "refused"), (case, history, forged)
            assert _forged_off_first_claims(history, forged, keys), (case, history, forged)
    assert seen.get(("accepted", "accepted"), 0) > 20, seen  # the cases reach both ends
    assert seen.get(("refused", "refused"), 0) > 20, seen
