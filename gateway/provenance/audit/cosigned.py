"""The witness part of `verify_log`: the cosigned checkpoints in a log's `cosigned/`.

Every cosignature line by a given witness must verify (C2SP tlog-cosignature); each
cosigned checkpoint must be one the log signed, for its origin and size, carrying the
log's own signature line (a signed note, as the gateway writes it; its root is then
checked against the entries by `verify_log`, like a trusted checkpoint's), and a size
beyond the log's newest checkpoint is a rollback. At least one checkpoint must carry
cosignatures by `min_witnesses` of the witnesses given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.errors import LogVerificationError, MalformedError, SignatureError
from gateway.provenance.formats.checkpoint import Checkpoint, SignedCheckpoint, open_checkpoint
from gateway.provenance.formats.cosignature import (
    CosignatureVerifier,
    distinct_witnesses,
    find_cosignature,
    unambiguous_witnesses,
)
from gateway.provenance.formats.layout import MAX_HISTORY, list_cosigned, read_log_file
from gateway.provenance.formats.note import Verifier, _parse_signature_line, _split_note

__all__ = [
    "WitnessSummary",
    "check_cosigned",
    "check_witness_policy",
    "cosigners",
    "witnesses_not_the_log",
]


@dataclass(frozen=True, slots=True)
class WitnessSummary:
    cosigned: int  # checkpoints in cosigned/
    witnessed_size: int  # largest size cosigned by at least `min_witnesses` witnesses
    min_witnesses: int
    newest_by: dict[str, int]  # witness -> largest size it cosigned


def witnesses_not_the_log(
    witnesses: Sequence[CosignatureVerifier], verifiers: Sequence[Verifier]
) -> None:
    """Raise ValueError when a witness key is one of the log's keys (as 0x01 or 0x04).

    Whoever signs the log could then cosign it too: an auditor who passes the log's own
    key as `--witness-key` would see the log "witnessed" by its operator.
    """
    log_keys = {verifier.public_key: verifier for verifier in verifiers}
    for witness in witnesses:
        if witness.public_key in log_keys:
            raise ValueError(
                f"witness key {witness} is the log's own key {log_keys[witness.public_key]}: "
                "whoever signs the log could cosign it, so it witnesses nothing"
            )


def check_witness_policy(
    witnesses: Sequence[CosignatureVerifier], verifiers: Sequence[Verifier], min_witnesses: int
) -> None:
    """Raise ValueError for a witness policy that would count wrong: two keys that are one
    public key, a witness key of the log's own, or a quorum outside 1..len(witnesses);
    KeyFormatError for a witness key under the name and key id of a log key or of another
    witness key (`unambiguous_witnesses`). `verify_log` and `check_tlog_proof` both apply
    it, before anything is read."""
    unambiguous_witnesses(witnesses, verifiers)
    distinct_witnesses(witnesses)
    witnesses_not_the_log(witnesses, verifiers)
    if witnesses and not 1 <= min_witnesses <= len(witnesses):
        raise ValueError(f"min_witnesses must be 1..{len(witnesses)} (the witness keys given)")


def cosigners(
    note: bytes, witnesses: Sequence[CosignatureVerifier], now: float
) -> list[CosignatureVerifier]:
    """The witnesses that validly cosigned `note`. Raises SignatureError when a line by one
    of them does not verify or is dated in the future, MalformedError for a bad note: a
    witness's bad line fails the check, it is not skipped."""
    return [w for w in witnesses if find_cosignature(note, w, now=now) is not None]


def _fail(reason: str) -> LogVerificationError:
    return LogVerificationError(reason)


def check_cosigned(
    log: LogDirectory,
    history: list[SignedCheckpoint],
    verifiers: Sequence[Verifier],
    witnesses: Sequence[CosignatureVerifier],
    min_witnesses: int,
    now: float,
    limit: int = MAX_HISTORY,
) -> tuple[list[tuple[str, Checkpoint]], WitnessSummary]:
    """Check `cosigned/` (`limit` files at most); returns its checkpoints (for the root
    checks) and a summary."""
    by_size = {signed.checkpoint.size: signed for signed in history}
    newest = history[-1].checkpoint
    found: list[tuple[str, Checkpoint]] = []
    newest_by: dict[str, int] = {}
    witnessed, most = 0, 0
    try:
        files = list_cosigned(log.path, limit)
    except MalformedError as exc:
        raise _fail(str(exc)) from exc
    for size, path in files:
        name = f"cosigned/{path.name}"
        try:
            data = read_log_file(path)
        except MalformedError as exc:
            raise _fail(str(exc)) from exc
        checkpoint = _cosigned_checkpoint(name, data, size, by_size, verifiers, newest)
        try:
            signed_by = cosigners(data, witnesses, now)
        except (SignatureError, MalformedError) as exc:
            raise _fail(f"{name}: {exc}") from exc
        count = len(signed_by)
        for witness in signed_by:
            newest_by[str(witness)] = max(size, newest_by.get(str(witness), 0))
        most = max(most, count)
        if count >= min_witnesses:
            witnessed = max(witnessed, size)
        found.append((f"cosigned checkpoint {name}", checkpoint))
    if not witnessed:
        where = "cosigned/ is empty or missing" if not files else f"the most any has is {most}"
        raise _fail(
            f"no checkpoint in cosigned/ carries cosignatures by at least {min_witnesses} of "
            f"the {len(witnesses)} given witness key(s) ({where}): the log is not witnessed"
        )
    summary = WitnessSummary(len(files), witnessed, min_witnesses, newest_by)
    return found, summary


def _cosigned_checkpoint(
    name: str,
    data: bytes,
    size: int,
    by_size: dict[int, SignedCheckpoint],
    verifiers: Sequence[Verifier],
    newest: Checkpoint,
) -> Checkpoint:
    """The checkpoint a cosigned file carries: signed by the log, for its origin and size."""
    try:
        text, lines = _split_note(data)
        checkpoint = Checkpoint.parse(text)
    except MalformedError as exc:
        raise _fail(f"{name}: {exc}") from exc
    known = by_size.get(size)
    if (
        known is not None
        and known.signatures.text == text
        and _log_lines_known(lines, known, verifiers)
    ):
        return checkpoint  # the very checkpoint the history holds (and has checked)
    try:
        checkpoint = open_checkpoint(data, verifiers, origin=newest.origin).checkpoint
    except (SignatureError, MalformedError) as exc:
        raise _fail(f"{name}: {exc}") from exc
    if checkpoint.size != size:
        raise _fail(f"{name} holds a checkpoint of size {checkpoint.size}, not {size}")
    if size > newest.size:
        raise _fail(
            f"rollback: a witness cosigned size {size}, but the log's newest checkpoint has "
            f"size {newest.size}"
        )
    return checkpoint


def _log_lines_known(
    lines: list[str], known: SignedCheckpoint, verifiers: Sequence[Verifier]
) -> bool:
    """Whether the file carries the log's signature as its history note does: at least one
    line by a key that signed that note (one that verified it; for a checkpoint from
    before a key rotation, `--accept-earlier-keys`, one of the earlier keys it names), and
    every line by such a key or by any trusted key one of that note's own, byte for byte
    (an Ed25519 signature of one text is one line). Else the file's note is opened in full:
    a file of checkpoint text and witness lines alone is no signed note, and a line by a
    trusted key is verified (a forged one beside the genuine line fails, as `open_note`)."""
    signed = known.signatures.verified or known.signatures.unverified  # earlier: none verified
    signing = {(signature.name, signature.key_id) for signature in signed}
    trusted = {(verifier.name, verifier.key_id) for verifier in verifiers}
    history = set(_split_note(known.note)[1])
    found = False
    for line in lines:
        try:
            signature = _parse_signature_line(line)
        except MalformedError:
            return False
        named = (signature.name, signature.key_id)
        if named in signing or named in trusted:
            if line not in history:
                return False
            found = found or named in signing
    return found
