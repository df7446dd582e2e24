"""The rotation order of the history below a receipt's checkpoint, verifying only the
checkpoints that decide it.

The order a receipt check applies (`receipt_keys`, `audit.rotation`) is decided by the
first checkpoint each key signed and by where checkpoints no trusted key signed lie; the
others carry nothing it reads. So the history is read once and each note's signature
lines parsed without verifying them (about 11 us a file, against some 200 us to verify
one), and only the checkpoint where each key first *claims* to sign is verified. A
forged line can only make a key's first claim earlier than its first signature, so when
each first claim verifies it is the key's first signature. When one does not verify, or a
note is malformed, named for another size or of another log, the whole history is read
again verifying every note, as before, and decides: a line that does not verify never
counts. What the fast reading does not prove is that every other checkpoint's lines
verify (it moves no key's first signature): `audit verify` checks that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.rotation import RotationOrder
from gateway.provenance.errors import LogVerificationError, MalformedError, SignatureError
from gateway.provenance.formats.checkpoint import Checkpoint, SignedCheckpoint, open_checkpoint
from gateway.provenance.formats.layout import history_upto, read_log_file
from gateway.provenance.formats.note import Verifier, _parse_signature_line, _split_note
from gateway.provenance.formats.receipt_payload import Receipt

__all__ = ["check_order_below", "check_size"]


@dataclass(slots=True)
class _Below:
    """What the history below the covering checkpoint says for the rotation order."""

    introduced: dict[str, SignedCheckpoint]  # key -> the first checkpoint it signed
    unsigned: tuple[int, int] | None = None  # the least and greatest size no trusted key signed

    def add_unsigned(self, size: int) -> None:
        low, high = self.unsigned or (size, size)
        self.unsigned = (min(low, size), max(high, size))


def check_order_below(
    log: LogDirectory,
    covering: SignedCheckpoint,
    receipt: Receipt,
    verifiers: Sequence[Verifier],
    limit: int,
) -> None:
    """Raise LogVerificationError unless `covering`, the first checkpoint to cover the
    receipt's entry, keeps the rotation order (`audit.rotation`) after the history below
    it, read one file at a time (never a listing; past `limit` files it fails naming it).
    The leading checkpoints no key of `verifiers` signed (before a rotation, the auditor
    holding only the new key) are skipped as `verify_log --accept-earlier-keys` skips
    them; one after a trusted one is refused."""
    below = _claimed_below(log, covering, receipt, verifiers, limit)
    if below is None:
        below = _verified_below(log, covering, receipt, verifiers, limit)
    first_trusted = min(
        (signed.checkpoint.size for signed in below.introduced.values()),
        default=covering.checkpoint.size,
    )
    if below.unsigned is not None and below.unsigned[1] > first_trusted:
        raise LogVerificationError(
            f"the checkpoint of size {below.unsigned[1]} (its history file), below the first "
            f"to cover entry {receipt.index} and above one a trusted key signed, is signed by "
            "no trusted key"
        )
    order = RotationOrder(after_unsigned=below.unsigned is not None)
    by_size = {signed.checkpoint.size: signed for signed in below.introduced.values()}
    for size in sorted(by_size):
        order.add(by_size[size])
    order.add(covering)


def check_size(signed: SignedCheckpoint, size: int, path: Path) -> None:
    """Raise LogVerificationError unless the history file `path`, named for `size`, holds
    a checkpoint of that size."""
    if signed.checkpoint.size != size:
        # the file is chosen by its name: an older note placed under a later name (one
        # the retired key signed) would otherwise decide which key the entry had
        raise LogVerificationError(
            f"checkpoint checkpoints/{path.name} holds size {signed.checkpoint.size}, "
            f"not {size}: its history file does not hold the checkpoint its name says"
        )


def _verified_below(
    log: LogDirectory,
    covering: SignedCheckpoint,
    receipt: Receipt,
    verifiers: Sequence[Verifier],
    limit: int,
) -> _Below:
    """Every checkpoint below `covering` opened with `verifiers` (its signatures verified)."""
    below = _Below({})
    for size, path in history_upto(log.path, covering.checkpoint.size - 1, limit):
        try:
            signed = open_checkpoint(read_log_file(path), verifiers, origin=receipt.log)
        except SignatureError:
            below.add_unsigned(size)
            continue
        check_size(signed, size, path)
        _introduce(below.introduced, signed)
    return below


def _claimed_below(
    log: LogDirectory,
    covering: SignedCheckpoint,
    receipt: Receipt,
    verifiers: Sequence[Verifier],
    limit: int,
) -> _Below | None:
    """The checkpoints below `covering` by the trusted keys their notes claim, each key's
    first claim verified; None when one does not verify or a note would fail to open
    otherwise than for want of a trusted line (`_verified_below` then decides)."""
    trusted = {(verifier.name, verifier.key_id) for verifier in verifiers}
    own = any(verifier.name == receipt.log for verifier in verifiers)
    below = _Below({})
    first: dict[str, tuple[int, bytes]] = {}  # key -> the first note claiming it (a few keys)
    for size, path in history_upto(log.path, covering.checkpoint.size - 1, limit):
        data = read_log_file(path)
        try:
            text, lines = _split_note(data)
            claims = [
                sig
                for sig in map(_parse_signature_line, lines)
                if (sig.name, sig.key_id) in trusted
            ]
            if not claims:  # open_note's "no signature by a trusted key", for certain
                below.add_unsigned(size)
                continue
            checkpoint = Checkpoint.parse(text)
        except MalformedError:
            return None
        if checkpoint.origin != receipt.log or checkpoint.size != size:
            return None  # open_checkpoint's or check_size's refusal, if its lines verify
        if own and all(sig.name != receipt.log for sig in claims):
            return None  # open_checkpoint's: another log's key signed it
        for key in {f"{sig.name}+{sig.key_id:08x}" for sig in claims}:
            if key not in first or size < first[key][0]:
                first[key] = (size, data)
    for data in dict(first.values()).values():  # one per note: keys may share one
        try:
            signed = open_checkpoint(data, verifiers, origin=receipt.log)
        except (SignatureError, MalformedError):
            return None  # a claimed line that does not verify: it must not count
        _introduce(below.introduced, signed)
    return below


def _introduce(introduced: dict[str, SignedCheckpoint], signed: SignedCheckpoint) -> None:
    """Record `signed` as the first checkpoint of each key that signed it, unless one of
    a smaller size is recorded already."""
    size = signed.checkpoint.size
    for sig in signed.signatures.verified:
        key = f"{sig.name}+{sig.key_id:08x}"
        if key not in introduced or size < introduced[key].checkpoint.size:
            introduced[key] = signed
