"""The history an audit opens: `checkpoints/` read within `HistoryLimits` (the log under
audit may hold millions of checkpoints, or notes of 1 MiB each), each note opened with the
auditor's keys, and after a key rotation the leading checkpoints only earlier keys signed
(`verify_log`'s step 1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.errors import LogVerificationError, MalformedError, SignatureError
from gateway.provenance.formats.checkpoint import Checkpoint, SignedCheckpoint, open_checkpoint
from gateway.provenance.formats.layout import (
    MAX_HISTORY,
    MAX_HISTORY_BYTES,
    MAX_NOTE_FILE,
    read_log_file,
)
from gateway.provenance.formats.note import Note, Verifier, _parse_signature_line, _split_note

__all__ = ["DEFAULT_LIMITS", "HistoryLimits", "open_history"]


def _fail(reason: str) -> LogVerificationError:
    return LogVerificationError(reason)


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """How much of `checkpoints/` (and `cosigned/`) an audit holds: the files it lists and
    the bytes of history notes it keeps (the log under audit may hold millions, or notes
    of 1 MiB each). Past either the audit fails naming the limit, rather than exhaust
    memory; an honest log past them needs the limit raised."""

    files: int = MAX_HISTORY
    bytes: int = MAX_HISTORY_BYTES


DEFAULT_LIMITS = HistoryLimits()


def open_history(
    log: LogDirectory,
    verifiers: Sequence[Verifier],
    origin: str | None,
    accept_earlier: bool,
    limits: HistoryLimits,
) -> tuple[list[SignedCheckpoint], int]:
    """The history, opened; and how many leading checkpoints only earlier keys signed."""
    try:
        history = log.history(limits.files)
    except MalformedError as exc:
        raise _fail(str(exc)) from exc
    if not history:
        raise _fail(f"{log.path} has no checkpoints/ history: not a log, or it was deleted")
    opened: list[SignedCheckpoint] = []
    earlier, held = 0, 0
    for size, path in history:
        name = f"checkpoints/{path.name}"
        try:
            data = read_log_file(path, min(MAX_NOTE_FILE, limits.bytes - held))
        except MalformedError as exc:
            why = f"checkpoint {name}: {exc}"
            if held + MAX_NOTE_FILE > limits.bytes:  # the file was read to the total's rest
                why += (
                    f" (the checkpoints before it hold {held} bytes; an audit holds at most "
                    f"{limits.bytes} bytes of checkpoints/: raise it with --max-history-bytes)"
                )
            raise _fail(why) from exc
        held += len(data)
        try:
            signed = open_checkpoint(data, verifiers, origin=origin)
        except SignatureError as exc:
            if not accept_earlier or earlier < len(opened):
                raise _fail(f"checkpoint {name}: {exc}") from exc
            signed = _earlier_checkpoint(name, data, verifiers, origin, exc)
            earlier += 1
        except MalformedError as exc:
            raise _fail(f"checkpoint {name}: {exc}") from exc
        if signed.checkpoint.size != size:
            raise _fail(f"checkpoint {name} holds size {signed.checkpoint.size}, not {size}")
        origin = signed.checkpoint.origin
        opened.append(signed)
    if earlier == len(opened):
        raise _fail(
            "no checkpoint is signed by a trusted key: give the log's current key "
            f"(the newest checkpoint, {history[-1][1].name}, is signed by others)"
        )
    return opened, earlier


def _earlier_checkpoint(
    name: str,
    data: bytes,
    verifiers: Sequence[Verifier],
    origin: str | None,
    cause: SignatureError,
) -> SignedCheckpoint:
    """A checkpoint from before a key rotation, signed only by keys the auditor lacks.

    Its root is still checked against the entries; a bad signature by a key the auditor
    does hold is never excused.
    """
    try:
        text, lines = _split_note(data)
        signatures = tuple(_parse_signature_line(line) for line in lines)
        checkpoint = Checkpoint.parse(text)
    except MalformedError as exc:
        raise _fail(f"checkpoint {name}: {exc}") from exc
    trusted = {(v.name, v.key_id) for v in verifiers}
    if any((sig.name, sig.key_id) in trusted for sig in signatures):
        raise _fail(f"checkpoint {name}: {cause}") from cause
    if origin is not None and checkpoint.origin != origin:
        raise _fail(f"checkpoint {name}: origin is {checkpoint.origin!r}, expected {origin!r}")
    return SignedCheckpoint(checkpoint, data, Note(text, (), signatures))
