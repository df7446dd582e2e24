"""`owngate audit prove`: a C2SP tlog-proof that a request's record is in the log."""

from __future__ import annotations

import argparse
import sys
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
from gateway.provenance.audit.shown import quoted
from gateway.provenance.formats.layout import list_cosigned, read_log_file
from gateway.provenance.formats.merkle import inclusion_proof
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
    if args.cosigned:
        covering = [(n, p) for n, p in list_cosigned(log.path) if index < n <= size]
        if not covering:
            print(
                f"error: no cosigned checkpoint covers entry {index} yet "
                "(witnesses not configured, or not yet reached)",
                file=sys.stderr,
            )
            return 1
        size, path = covering[-1]
        note = read_log_file(path)
    entry = log.bundle(index // 256, size)[index % 256]
    hashes = inclusion_proof(index, size, TileReader(log.path, size).node)
    sys.stdout.write(TlogProof(index, tuple(hashes), note, extra=entry).format())
    return 0
