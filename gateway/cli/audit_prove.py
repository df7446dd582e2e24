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
from gateway.provenance.audit.receipt import read_receipt
from gateway.provenance.audit.shown import quoted, shown
from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.layout import history_path, newest_cosigned, read_log_file
from gateway.provenance.formats.merkle import inclusion_proof, leaf_hash
from gateway.provenance.formats.note import _parse_signature_line, _split_note
from gateway.provenance.formats.receipts import receipt_claims
from gateway.provenance.formats.records import Record
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
        default=env("RECORD"),
        help="which record of the request: the last of that type (after a failover, the "
        "attempt the client's answer came from; env OWNGATE_AUDIT_RECORD, default dispatch)",
    )
    which = prove.add_mutually_exclusive_group()
    which.add_argument(
        "--receipt",
        default=env("RECEIPT"),
        metavar="FILE",
        help="prove the entry this receipt of the request names (its index, its "
        "dispatch_hash), whichever attempt it is (env OWNGATE_AUDIT_RECEIPT)",
    )
    which.add_argument(
        "--index",
        type=int,
        default=None,
        metavar="N",
        help="prove entry N, a record of the request",
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
    # One reading: the record chosen is the very bytes proved (and quoted in the proof).
    found = log.find_request_entries(args.request_id, size)
    chosen = _chosen(args, found)
    if isinstance(chosen, str):
        print(f"error: {chosen}", file=sys.stderr)
        return 1
    index, entry = chosen
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
    hashes = inclusion_proof(index, size, TileReader(log.path, size).node)
    sys.stdout.write(TlogProof(index, tuple(hashes), note, extra=entry).format())
    return 0


def _chosen(
    args: argparse.Namespace, found: list[tuple[int, bytes, Record]]
) -> tuple[int, bytes] | str:
    """The (index, entry) of the request's records `found` to prove, or why none is: entry
    `--index`, else the one `--receipt` names (an explicit --index wins over the
    environment's receipt), else the last of the `--record` type."""
    request = quoted(args.request_id)
    claims = None
    if args.index is None and args.receipt is not None:
        claims = receipt_claims(read_receipt(args.receipt))
        if claims.request_id != args.request_id:
            return f"the receipt is of request {quoted(claims.request_id)}, not {request}"
    if claims is not None or args.index is not None:
        index = args.index if claims is None else claims.index
        what = f"entry {index}" + ("" if claims is None else ", the receipt's,")
        match = next(((e, r) for i, e, r in found if i == index), None)
        if match is None:
            return f"{what} is not a record of {request} in the log's latest checkpoint"
        entry, record = match
        if claims is not None and leaf_hash(entry) != claims.dispatch_hash:
            return f"{what} is not the record the receipt names (another dispatch_hash)"
        if args.record is not None and record.type != args.record:
            return f"{what} is a {record.type} record, not a {args.record} record"
        return index, entry
    kind = args.record or "dispatch"
    matches = [(i, e) for i, e, r in found if r.type == kind]
    if not matches:
        return f"no {kind} record of {request} in the log"
    if len(matches) > 1:
        listed = ", ".join(str(i) for i, _ in matches)
        print(
            f"note: {request} has {len(matches)} {kind} records (entries {listed}, one per "
            f"attempt): proving entry {matches[-1][0]}, the last (the attempt the client's "
            "answer came from); --receipt FILE proves the one a receipt names, --index N any",
            file=sys.stderr,
        )
    return matches[-1]


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
