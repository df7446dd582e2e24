"""`owngate audit open`: show that a body file and salt open a commitment, given or read
from the log through a receipt."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.audit_flags import (
    env,
    guarded,
    key_flag,
    max_checkpoints_flag,
    trusted_keys,
)
from gateway.cli.audit_receipt import carries_countersignature
from gateway.provenance import LogDirectory, verify_receipt
from gateway.provenance.audit.body_file import BodyFile, read_body_file
from gateway.provenance.audit.receipt import (
    check_stream_end,
    read_receipt,
    receipt_commitment,
)
from gateway.provenance.audit.receipt_keys import check_receipt_key, check_receipt_log_key
from gateway.provenance.audit.shown import shown
from gateway.provenance.formats.commitments import BodyKind, commit_digest, verify_digest
from gateway.provenance.formats.stream_body import committed_bodies, countersigned_body

__all__ = ["add_open"]


# Which bytes of a response file a commitment may be to (docs/provenance.md, "The body a
# client commits to"): all of them; a stream as received less the gateway's own tail (its
# receipt line, and the line end or error event it may write before it); or an answer
# the backend countersigned, less the receipt line alone.
FORMS = ("exact", "stream", "countersigned")


def add_open(verbs: Any) -> None:
    opener = verbs.add_parser(
        "open",
        help="show that a body file and salt match a commitment",
        description="Recompute SHA-256(domain || salt || SHA-256(body)) and compare it with "
        "a commitment, given directly or read from the log via a receipt. A response body "
        "opened with --salt/--commitment needs --form: which of its bytes the commitment "
        "is to (with --receipt the log says). The result names the bytes that opened it.",
    )
    opener.add_argument(
        "body",
        help="the request or response body file, as sent/received (a stream as received: "
        "with --form stream the gateway's receipt line and what it wrote before it are "
        "taken off; with --form countersigned only the receipt line)",
    )
    opener.add_argument(
        "--kind",
        choices=("request", "response"),
        default=env("KIND", "request"),
        help="which body this is (env OWNGATE_AUDIT_KIND, default request)",
    )
    opener.add_argument(
        "--form",
        default=env("FORM"),
        metavar="|".join(FORMS),
        help="which bytes of a response file the commitment is to, with --salt/--commitment "
        "(required there for --kind response): exact, all of them (a whole answer, or a "
        "stream with the gateway's tail already taken off); stream, a stream as received "
        "less the gateway's own tail; countersigned, an answer the backend countersigned, "
        "less the receipt line alone. A request is always exact. (env OWNGATE_AUDIT_FORM)",
    )
    opener.add_argument("--salt", default=env("SALT"), help="salt, hex (env OWNGATE_AUDIT_SALT)")
    opener.add_argument(
        "--commitment", default=env("COMMITMENT"), help="hex (env OWNGATE_AUDIT_COMMITMENT)"
    )
    opener.add_argument(
        "--receipt",
        default=env("RECEIPT"),
        help="take the salt from this receipt and the commitment from --log "
        "(env OWNGATE_AUDIT_RECEIPT)",
    )
    opener.add_argument("--log", default=env("LOG"), help="log directory (env OWNGATE_AUDIT_LOG)")
    key_flag(opener, required=False)
    max_checkpoints_flag(
        opener, "the --log's checkpoints/ (scanned for the one covering the receipt's entry)"
    )
    opener.set_defaults(handler=guarded(_open))


def _form_problem(args: argparse.Namespace) -> str | None:
    """Why `--form` (given or not) cannot say which bytes to open, or None."""
    if args.form is not None and args.form not in FORMS:
        return f"--form is one of {', '.join(FORMS)}, not {shown(args.form)}"
    if args.receipt is not None and args.form is not None:
        return (
            "--form goes with --salt/--commitment: with --receipt the log says which bytes "
            "the commitment is to (all of a request; of a response, a stream less the "
            "gateway's tail, or less its receipt line alone when countersigned)"
        )
    if args.kind == "request" and args.form not in (None, "exact"):
        return "a request commitment is to the body as sent, all of it: --form exact"
    if args.kind == "response" and args.receipt is None and args.form is None:
        return (
            "give --form exact|stream|countersigned with --kind response: which bytes of "
            f"{shown(args.body)} the commitment is to (exact: all of them; stream: a stream "
            "as received less the gateway's receipt line and what it wrote before it; "
            "countersigned: less the receipt line alone), or --receipt and --log"
        )
    return None


def _open(args: argparse.Namespace) -> int:
    problem = _form_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    body = read_body_file(args.body)  # hashed in chunks as it is read, never held whole
    salt_hex, commitment = args.salt, args.commitment
    form = args.form or "exact"
    logged = None
    if args.receipt is not None:
        if args.log is None or not (args.key or args._key_defaults):
            print("error: --receipt needs --log and --key", file=sys.stderr)
            return 2
        envelope = read_receipt(args.receipt)
        receipt = verify_receipt(envelope, trusted_keys(args))
        # as `receipt verify`: a key named for the log, the log's key when the entry was written
        check_receipt_log_key(envelope, receipt, trusted_keys(args))
        log = LogDirectory(args.log)
        check_receipt_key(log, envelope, receipt, trusted_keys(args), args.max_checkpoints)
        salts = receipt.salts
        salt_hex = (salts.request if args.kind == "request" else salts.response).hex()
        logged = receipt_commitment(log, receipt, args.kind, trusted_keys(args))
        commitment = logged.commitment
        # A countersigned answer is whole: the log's completion says so, or the receipt
        # carries a countersignature; any other response is a stream less the gateway's tail.
        whole = logged.countersigned or carries_countersignature(envelope)
        form = "exact" if args.kind == "request" else "countersigned" if whole else "stream"
    if salt_hex is None or commitment is None:
        print("error: give --salt and --commitment, or --receipt and --log", file=sys.stderr)
        return 2
    salt = bytes.fromhex(salt_hex)
    commitment = commitment.strip().lower()
    kind: BodyKind = "request" if args.kind == "request" else "response"
    candidates = _candidates(body.tail, form)
    opened = next(
        (c for c in candidates if commit_digest(kind, salt, body.sha256(c)) == commitment), None
    )
    if opened is None:  # the first is the likeliest: name what it commits to
        verify_digest(kind, commitment, salt, body.sha256(candidates[0]))  # raises
        raise AssertionError("a candidate that opens was missed")  # pragma: no cover
    if form == "stream":  # an error event taken off: the record's? (none: refused)
        check_stream_end(logged, body.tail, opened)
    print(
        f"ok: {shown(args.body)} with this salt opens the {args.kind} commitment "
        f"{shown(commitment)}: form {form}, {_which_bytes(body, opened)}"
    )
    return 0


def _candidates(received: bytes, form: str) -> tuple[bytes, ...]:
    """The bytes of `received` a commitment in `form` may be to: exact, all of them;
    stream, `committed_bodies` (the received bytes less a tail of what the gateway may
    have written after the backend's); countersigned, `countersigned_body` (less its
    receipt line alone)."""
    if form == "stream":
        return committed_bodies(received)
    if form == "countersigned":
        return (countersigned_body(received),)
    return (received,)


def _which_bytes(body: BodyFile, opened: bytes) -> str:
    """Which bytes of the file the commitment is to, said plainly: all of them, or the
    first N and what of the gateway's was taken off after them (`opened`: a prefix of
    the file's tail)."""
    if opened == body.tail:
        return f"all {body.size} bytes of it"
    tail = body.tail[len(opened) :]
    before = tail[: tail.rfind(b": owngate-receipt ")]
    event = before.find(b'data: {"error":')
    ends = len(before if event < 0 else before[:event])
    parts = [f"{ends} line end{'s' if ends > 1 else ''}"] if ends else []
    parts += ["its error event"] if event >= 0 else []
    return (
        f"its first {body.length(opened)} of {body.size} bytes (taken off after them, the "
        f"gateway's own: {', '.join([*parts, 'its receipt line'])})"
    )
