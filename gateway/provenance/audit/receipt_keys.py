"""Which log key may have signed a receipt, after key rotations: the one the log was
signed with when its entry was written.

A rotation goes A, A+B, B (docs/provenance.md, "Keys"), and the log's history holds every
checkpoint with the keys that signed it. A receipt is signed at dispatch, before the next
checkpoint, by the key the gateway then signed with; that key signs the checkpoint that
first covers the receipt's entry (the overlap checkpoints carry both keys). So a receipt
is accepted when a key that signed it also signed the first checkpoint in the history
covering its entry: receipts signed by A before the rotation keep verifying, with A given
as a trusted key, long after A is retired, and one signed by A for an entry first covered
by a checkpoint B alone signed (written after A's retirement, by whoever kept A) is
refused. `owngate audit receipt verify --log` and the admin API's receipt check both
apply it, and, as `verify_log` does, refuse a history file whose checkpoint is not of
the size its name says. The history up to that checkpoint must follow the rotation order
(`audit.rotation`, which `verify_log` applies to the whole history): else whoever kept A
appended entries after the rotation, signed a checkpoint over them with A alone, and a
receipt A signed for one was accepted, that checkpoint being the first to cover it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.receipt_order import check_order_below, check_size
from gateway.provenance.errors import LogVerificationError, MalformedError, SignatureError
from gateway.provenance.formats.checkpoint import open_checkpoint
from gateway.provenance.formats.layout import MAX_HISTORY, first_history_above, read_log_file
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.receipt_payload import Receipt
from gateway.provenance.formats.receipts import verify_receipt

__all__ = ["check_receipt_key", "check_receipt_log_key", "receipt_signers"]


def receipt_signers(envelope: bytes, verifiers: Sequence[Verifier]) -> list[Verifier]:
    """The keys of `verifiers` whose signature on the receipt verifies (each alone)."""
    found = []
    for verifier in verifiers:
        try:
            verify_receipt(envelope, [verifier])
        except SignatureError:
            continue  # not signed by this key (a bad signature by it failed verify_receipt)
        found.append(verifier)
    return found


def check_receipt_log_key(
    envelope: bytes, receipt: Receipt, verifiers: Sequence[Verifier]
) -> tuple[list[Verifier], bool]:
    """The keys of `verifiers` that signed the receipt, and whether one of them is named
    for the log the receipt says it is of (a log's key is named for its origin,
    docs/provenance.md "Keys", as C2SP checkpoints recommend: nothing else ties a receipt's
    `log` claim to a key without the log's checkpoints). Raises LogVerificationError when
    a key named for that log is given and none of them signed it: a key another log's (a
    replica's) signed a receipt claiming this log's origin."""
    signers = receipt_signers(envelope, verifiers)
    if any(signer.name == receipt.log for signer in signers):
        return signers, True
    own = [str(verifier) for verifier in verifiers if verifier.name == receipt.log]
    if own:
        raise LogVerificationError(
            f"the receipt says it is of the log {receipt.log!r}, but it is signed by "
            f"{', '.join(str(signer) for signer in signers)}, not by that log's key "
            f"({', '.join(own)}): another log's key signed it"
        )
    return signers, False


def check_receipt_key(
    log: LogDirectory,
    envelope: bytes,
    receipt: Receipt,
    verifiers: Sequence[Verifier],
    max_checkpoints: int = MAX_HISTORY,
) -> None:
    """Raise LogVerificationError unless a key of `verifiers` that signed the receipt (one
    `verify_receipt` accepted) signed the first checkpoint of the log's history that covers
    the receipt's entry; without a history file covering it, the latest checkpoint. The
    history below that checkpoint (either one) must keep the rotation order with it
    (`audit.rotation`); it is read one file at a time, no listing kept; past
    `max_checkpoints` files it fails naming the limit (the operator under audit may have
    padded `checkpoints/`)."""
    signers = {str(verifier) for verifier in receipt_signers(envelope, verifiers)}
    try:
        first = first_history_above(log.path, receipt.index, max_checkpoints)
    except MalformedError as exc:
        raise LogVerificationError(str(exc)) from exc
    if first is not None:
        size, path = first
        note, where = read_log_file(path), f"the checkpoint of size {size} (its history file)"
    else:
        note, where = log.latest_note(), "the log's latest checkpoint"
    try:
        signed = open_checkpoint(note, verifiers, origin=receipt.log)
    except SignatureError as exc:
        raise LogVerificationError(
            f"{where}, the first to cover entry {receipt.index}, is signed by no trusted key: {exc}"
        ) from exc
    if first is not None:
        check_size(signed, *first)
    # the served checkpoint too: else whoever kept a retired key signed it alone and left
    # its history file out, and the order was never applied
    check_order_below(log, signed, receipt, verifiers, max_checkpoints)
    keys = {f"{s.name}+{s.key_id:08x}" for s in signed.signatures.verified}
    if not signers & keys:
        raise LogVerificationError(
            f"the receipt is signed by {', '.join(sorted(signers))}, but {where}, the first "
            f"to cover entry {receipt.index}, is signed by {', '.join(sorted(keys))}: the "
            "receipt's key was not the log's key when the entry was written (a key retired "
            "by a rotation signed it after its retirement)"
        )
