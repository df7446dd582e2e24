"""`owngate audit prove`: a C2SP tlog-proof that a request's record is in the log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.cli.audit_flags import (
    env,
    guarded,
    unverified_size,
)
from gateway.provenance import (
    LogDirectory,
    TlogProof,
)
from gateway.provenance.audit.shown import quoted, shown
from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.layout import history_path, newest_cosigned, read_log_file
from gateway.provenance.formats.merkle import inclusion_proof
from gateway.provenance.formats.note import _parse_signature_line, _split_note
from gateway.provenance.formats.tiles import TileReader

__all__ = ["add_prove"]


def add_prove(verbs: Any) -> None:
    prove = verbs.add_parser(
        "prove",
        help="print a C2SP tlog-proof that a request's record is in the log",
        description="Print a c2sp.org/tlog-proof@v1 inclusion proof of one record of a "
        "request against the log's latest checkpoint. The proof's extra line holds the "
        "record itself.",
    )
    prove.add_argument("logdir", help="the log directory")
    prove.add_argument("request_id", help="the request id (as in the receipt)")
    prove.add_argument(
        "--record",
        choices=("dispatch", "completion", "refusal", "admin"),
        default=env("RECORD", "dispatch"),
        help="which record of the request (env OWNGATE_AUDIT_RECORD, default dispatch)",
    )
    prove.add_argument(
        "--cosigned",
        action="store_true",
        help="prove against the newest witness-cosigned checkpoint (LOGDIR/cosigned/) that "
        "covers the record, so the proof carries the witnesses' cosignatures",
    )
    prove.set_defaults(handler=guarded(_prove))


def _prove(args: argparse.Namespace) -> int:
    log = LogDirectory(args.logdir)
    note = log.latest_note()
    size = unverified_size(note)
    matches = [(i, r) for i, r in log.find_request(args.request_id, size) if r.type == args.record]
    if not matches:
        print(
            f"error: no {args.record} record of {quoted(args.request_id)} in the log",
            file=sys.stderr,
        )
        return 1
    index, _ = matches[0]
    where = "checkpoint"
    if args.cosigned:
        covering = newest_cosigned(log.path, above=index, upto=size)  # no listing kept
        if covering is None:
            print(
                f"error: no cosigned checkpoint covers entry {index} yet "
                "(witnesses not configured, or not yet reached)",
                file=sys.stderr,
            )
            return 1
        size, path = covering
        note, where = read_log_file(path), f"cosigned/{path.name}"
        _check_log_lines(note, where, _read_history(log.path, size, where))
    _check_printable(note, where)
    entry = log.bundle(index // 256, size)[index % 256]
    hashes = inclusion_proof(index, size, TileReader(log.path, size).node)
    sys.stdout.write(TlogProof(index, tuple(hashes), note, extra=entry).format())
    return 0


def _check_printable(note: bytes, name: str) -> None:
    """Refuse a checkpoint note that holds a character a terminal acts on (a control, a
    bidi override, a line separator: `shown` escapes them, a proof cannot): the proof
    quotes the note whole, and is printed to the auditor's terminal. No C0 control is in
    a signed note; the writer puts no extension line in a checkpoint."""
    try:
        text = note.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError(f"the {name} file is not UTF-8: not a checkpoint") from exc
    bad = next((char for char in text if char != "\n" and not char.isprintable()), None)
    if bad is not None:
        raise MalformedError(
            f"the {name} file holds {shown(bad)}, a control or format character: no "
            "proof quoting it is written (it would reach the terminal as is)"
        )


def _read_history(directory: Path, size: int, where: str) -> bytes:
    """The log's own note of `size` (`checkpoints/`), the one a cosigned file must carry."""
    try:
        return read_log_file(history_path(directory, size))
    except FileNotFoundError as exc:
        raise MalformedError(
            f"{where}: the log has no checkpoint of that size in checkpoints/, so it carries "
            "no checkpoint the log signed: no proof against it"
        ) from exc


def _check_log_lines(note: bytes, where: str, history: bytes) -> None:
    """Refuse a cosigned note that is not the log's own signed note of its size with lines
    added: its checkpoint text must be the history note's, it must carry a signature line
    of that note, and every line under a key that signed it must be one of its own, byte
    for byte. No key is given to `prove`, so the log's lines are those of its history
    note; before, a cosigned file without them, or with a forged one, went into the proof
    (which `proof verify` then failed, or, with the witness lines, seemed witnessed)."""
    text, lines = _split_note(note)
    known_text, known_lines = _split_note(history)
    name = f"checkpoints/{where.rpartition('/')[2]}"
    if text != known_text:
        raise MalformedError(f"{where} holds another checkpoint than {name}: no proof against it")
    known = set(known_lines)
    signers = {_key_of(line) for line in known_lines}
    carried = 0
    for line in lines:
        if _key_of(line) in signers:
            if line not in known:
                raise MalformedError(
                    f"{where} has a line under the log's key that is not {name}'s own: "
                    "no proof against it"
                )
            carried += 1
    if not carried:
        raise MalformedError(
            f"{where} carries none of the log's signature lines ({name}): no proof against it"
        )


def _key_of(line: str) -> tuple[str, int]:
    signature = _parse_signature_line(line)
    return signature.name, signature.key_id
