"""`owngate audit receipt verify` and `owngate audit open`: a client's receipt, and the
commitments it opens."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.cli.audit_flags import (
    backend_keys,
    env,
    env_list,
    guarded,
    key_flag,
    trusted_keys,
    usage,
)
from gateway.provenance import (
    LogDirectory,
    receipt_version,
    verify_commitment,
    verify_receipt,
)
from gateway.provenance.audit.receipt import (
    check_receipt_in_log,
    read_receipt,
    receipt_commitment,
)
from gateway.provenance.formats.attestation import receipt_countersignature
from gateway.provenance.formats.commitments import BodyKind
from gateway.provenance.formats.records import parse_record

__all__ = ["add_open", "add_receipt"]


def add_receipt(verbs: Any) -> None:
    receipt = verbs.add_parser("receipt", help="check a request receipt")
    actions = receipt.add_subparsers(dest="action", metavar="ACTION")
    verify = actions.add_parser(
        "verify",
        help="check a receipt's signature (and, with --log, that the log holds it)",
        description="Check the DSSE signature of a receipt. With --log, also check that the "
        "log's entry at the receipt's index is that request's dispatch record, with the "
        "receipt's hash, inside a checkpoint signed by a trusted key.",
    )
    verify.add_argument("file", help="the receipt (DSSE envelope JSON)")
    key_flag(verify, required=True)
    verify.add_argument("--log", default=env("LOG"), help="log directory (env OWNGATE_AUDIT_LOG)")
    verify.add_argument(
        "--backend-key",
        action="append",
        default=None,
        metavar="ID=VKEY",
        help="an attested backend's key: a receipt naming backend ID must carry its valid "
        "countersignature for this request (env OWNGATE_AUDIT_BACKEND_KEY)",
    )
    for kind in ("request", "response"):
        verify.add_argument(
            f"--{kind}-body",
            default=env(f"{kind.upper()}_BODY"),
            metavar="FILE",
            help=f"the {kind} body as the client {'sent' if kind == 'request' else 'got'} it: "
            f"the backend's countersignature must commit to exactly it (needs --backend-key; "
            f"env OWNGATE_AUDIT_{kind.upper()}_BODY)",
        )
    verify.set_defaults(
        handler=guarded(_receipt_verify), _backend_key_defaults=env_list("BACKEND_KEY")
    )
    receipt.set_defaults(handler=lambda _args: usage(receipt))


def _receipt_verify(args: argparse.Namespace) -> int:
    keys = trusted_keys(args)
    envelope = read_receipt(args.file)
    receipt = verify_receipt(envelope, keys)
    names = (
        f"dispatch entry {receipt.index} to backend {receipt.backend}"
        if receipt.backend
        else f"refusal entry {receipt.index} (nothing was dispatched)"
    )
    form = " (v2: its batch's signature and Merkle path)" if receipt_version(envelope) == 2 else ""
    print(
        f"ok: receipt for request {receipt.request_id} signed by the log {receipt.log}{form}: "
        f"{names}, policy {receipt.policy_digest}"
    )
    statement = receipt_countersignature(
        envelope, receipt, backend_keys(args.backend_key or args._backend_key_defaults, keys)
    )
    bodies = {"request": args.request_body, "response": args.response_body}
    if any(bodies.values()) and statement is None:
        print(
            "error: --request-body and --response-body check the backend's countersignature: "
            f"give --backend-key {receipt.backend}=VKEY",
            file=sys.stderr,
        )
        return 2
    if statement is not None:
        print(
            f"ok: countersigned by backend {receipt.backend}'s key {statement.key} "
            f"(counter {statement.counter})"
        )
        # The client's own bytes against what the backend signed, with the receipt's salts.
        checks: tuple[tuple[BodyKind, bytes, str], ...] = (
            ("request", receipt.salts.request, statement.request_commitment),
            ("response", receipt.salts.response, statement.response_commitment),
        )
        for kind, salt, committed in checks:
            name = bodies[kind]
            if name:
                verify_commitment(kind, committed, salt, Path(name).read_bytes())
                print(f"ok: the backend countersigned this {kind} body ({name})")
    if args.log is None:
        return 0
    inclusion = check_receipt_in_log(LogDirectory(args.log), receipt, keys)
    size = inclusion.size
    if (
        statement is not None
        and parse_record(inclusion.entry).data.get("request_commitment")
        != statement.request_commitment
    ):
        print(
            f"FAILED: the countersigned request commitment differs from entry {receipt.index}'s",
            file=sys.stderr,
        )
        return 1
    print(f"ok: entry {receipt.index} is in the checkpoint of size {size}")
    return 0


def add_open(verbs: Any) -> None:
    opener = verbs.add_parser(
        "open",
        help="show that a body file and salt match a commitment",
        description="Recompute SHA-256(domain || salt || SHA-256(body)) and compare it with "
        "a commitment, given directly or read from the log via a receipt.",
    )
    opener.add_argument("body", help="the request or response body file, as sent/received")
    opener.add_argument(
        "--kind",
        choices=("request", "response"),
        default=env("KIND", "request"),
        help="which body this is (env OWNGATE_AUDIT_KIND, default request)",
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
    opener.set_defaults(handler=guarded(_open))


def _open(args: argparse.Namespace) -> int:
    body = Path(args.body).read_bytes()
    salt_hex, commitment = args.salt, args.commitment
    if args.receipt is not None:
        if args.log is None or not (args.key or args._key_defaults):
            print("error: --receipt needs --log and --key", file=sys.stderr)
            return 2
        receipt = verify_receipt(read_receipt(args.receipt), trusted_keys(args))
        salts = receipt.salts
        salt_hex = (salts.request if args.kind == "request" else salts.response).hex()
        commitment = receipt_commitment(
            LogDirectory(args.log), receipt, args.kind, trusted_keys(args)
        )
    if salt_hex is None or commitment is None:
        print("error: give --salt and --commitment, or --receipt and --log", file=sys.stderr)
        return 2
    verify_commitment(args.kind, commitment, bytes.fromhex(salt_hex), body)
    print(f"ok: {args.body} with this salt opens the {args.kind} commitment {commitment}")
    return 0
