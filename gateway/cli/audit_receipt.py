"""`owngate audit receipt verify`: a client's receipt, checked alone, against the log, and
with the backend's countersignature (`owngate audit open` is gateway/cli/audit_open.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.audit_flags import (
    backend_keys,
    backend_pins,
    env,
    env_list,
    guarded,
    key_flag,
    max_checkpoints_flag,
    trusted_keys,
    usage,
)
from gateway.provenance import (
    LogDirectory,
    receipt_version,
    verify_receipt,
)
from gateway.provenance.audit.body_file import read_body_file
from gateway.provenance.audit.pinned import check_pinned
from gateway.provenance.audit.receipt import (
    check_countersignature_in_log,
    check_receipt_in_log,
    completion_that_sent_nothing,
    read_receipt,
    uncountersigned_error,
)
from gateway.provenance.audit.receipt_keys import check_receipt_key, check_receipt_log_key
from gateway.provenance.audit.shown import shown
from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.attestation import receipt_countersignature
from gateway.provenance.formats.commitments import commit_digest, verify_digest
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.receipts import countersignature_of
from gateway.provenance.formats.records import parse_record
from gateway.provenance.formats.stream_body import countersigned_body

__all__ = ["add_receipt", "carries_countersignature"]


def carries_countersignature(envelope: bytes) -> bool:
    try:
        return countersignature_of(envelope) is not None
    except MalformedError:
        return True  # something under its name, unreadable: still not checked


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
        "countersignature for this request, unless --log's completion of it is an error "
        "answer, which none is (env OWNGATE_AUDIT_BACKEND_KEY)",
    )
    verify.add_argument(
        "--backend-pin",
        action="append",
        default=None,
        metavar="ID=PIN",
        help="a key backend ID's owner publishes (sha256//base64, as tls.pin_spki_sha256): "
        "a receipt naming backend ID needs --log, whose dispatch record of it must name one "
        "of ID's pins as the key the backend presented (the receipt itself carries no key); "
        "repeat per backend or per key of a rotation (env OWNGATE_AUDIT_BACKEND_PIN)",
    )
    verify.add_argument(
        "--request-body",
        default=env("REQUEST_BODY"),
        metavar="FILE",
        help="the request body as the client sent it: the backend's countersignature must "
        "commit to exactly it (needs --backend-key; env OWNGATE_AUDIT_REQUEST_BODY)",
    )
    verify.add_argument(
        "--response-body",
        "--response",
        dest="response_body",
        default=env("RESPONSE_BODY") or env("RESPONSE"),
        metavar="FILE",
        help="the response body as the client got it (a stream as received, the gateway's "
        "receipt line included or not): the backend's countersignature must commit to it "
        "(needs --backend-key; env OWNGATE_AUDIT_RESPONSE_BODY)",
    )
    max_checkpoints_flag(
        verify, "the --log's checkpoints/ (scanned for the one covering the entry)"
    )
    verify.set_defaults(
        handler=guarded(_receipt_verify),
        _backend_key_defaults=env_list("BACKEND_KEY"),
        _backend_pin_defaults=env_list("BACKEND_PIN"),
    )
    receipt.set_defaults(handler=lambda _args: usage(receipt))


def _receipt_verify(args: argparse.Namespace) -> int:
    keys = trusted_keys(args)
    pins = backend_pins(args.backend_pin or args._backend_pin_defaults)
    envelope = read_receipt(args.file)
    receipt = verify_receipt(envelope, keys)
    names = (
        f"dispatch entry {receipt.index} to backend {shown(receipt.backend)}"
        if receipt.backend
        else f"refusal entry {receipt.index} (nothing was dispatched)"
    )
    form = " (v2: its batch's signature and Merkle path)" if receipt_version(envelope) == 2 else ""
    signers, named = check_receipt_log_key(envelope, receipt, keys)
    print(
        f"ok: receipt for request {shown(receipt.request_id)} of the log {shown(receipt.log)} "
        f"signed by {_keys(signers)}{form}: {names}, policy {shown(receipt.policy_digest)}"
    )
    if not named and args.log is None:
        print(
            f"note: no key that signed it is named for the log {shown(receipt.log)} (a log's "
            "key carries its origin as its name), so that the receipt is that log's is the "
            "receipt's own claim, not checked: add --log LOGDIR (its checkpoints of that log "
            "must be signed by the key that signed the receipt)"
        )
    attested = backend_keys(args.backend_key or args._backend_key_defaults, keys)
    # No answer of 400 or more is countersigned: with --log, the completion says which.
    bare = (
        args.log is not None
        and receipt.backend in attested
        and countersignature_of(envelope) is None
    )
    statement = None if bare else receipt_countersignature(envelope, receipt, attested)
    if attested and receipt.backend not in attested:
        # A key for another backend checks nothing here: say so, as `audit verify` does
        # for a key under an id its log never dispatched to.
        print(
            f"note: the receipt names backend {shown(receipt.backend) or '(none: a refusal)'}, "
            f"for which no --backend-key is given ({', '.join(map(shown, sorted(attested)))}"
            " given): its answer is the gateway's word alone"
        )
    if statement is None and carries_countersignature(envelope):
        print(
            f"note: the receipt carries a countersignature, not checked: give --backend-key "
            f"{shown(receipt.backend)}=VKEY (the backend's sidecar key) to check it; until then "
            "this receipt is the gateway's word alone"
        )
    if (args.request_body or args.response_body) and statement is None and not bare:
        print(
            "error: --request-body and --response-body check the backend's countersignature: "
            + (
                f"give --backend-key {shown(receipt.backend)}=VKEY "
                if receipt.backend
                else "a refusal has none "
            )
            + "(for the log's own commitments: owngate audit open --receipt --log)",
            file=sys.stderr,
        )
        return 2
    if statement is not None:
        print(
            f"ok: countersigned by backend {shown(receipt.backend)}'s key {shown(statement.key)} "
            f"(counter {statement.counter})"
        )
        # The client's own bytes against what the backend signed, with the receipt's salts.
        # Each file is hashed in chunks as it is read (body_file): never held whole.
        if args.request_body:
            body = read_body_file(args.request_body)
            digest = body.sha256(body.tail)
            verify_digest("request", statement.request_commitment, receipt.salts.request, digest)
            print(f"ok: the backend countersigned this request body ({args.request_body})")
        if args.response_body:
            body = read_body_file(args.response_body)
            # A countersigned answer is whole: the gateway wrote nothing after the
            # backend's bytes but its receipt line (no error event, no line end).
            digest = body.sha256(countersigned_body(body.tail))
            if commit_digest("response", receipt.salts.response, digest) != (
                statement.response_commitment
            ):
                print(
                    "FAILED: the body and salt do not open this response commitment: "
                    f"{args.response_body} is not the response the backend countersigned "
                    "(as received, nor with the gateway's receipt line, and nothing else, "
                    "taken off a stream)",
                    file=sys.stderr,
                )
                return 1
            print(f"ok: the backend countersigned this response body ({args.response_body})")
    if pins and receipt.backend not in pins:
        print(
            f"note: the receipt names backend {shown(receipt.backend) or '(none: a refusal)'}, "
            f"for which no --backend-pin is given ({', '.join(map(shown, sorted(pins)))} "
            "given): the key it presented is not checked"
        )
    if args.log is None and receipt.backend in pins:
        print(
            f"error: --backend-pin checks the key the log's dispatch record of backend "
            f"{shown(receipt.backend)} names, which the receipt does not carry: add --log LOGDIR",
            file=sys.stderr,
        )
        return 2
    if args.log is None:
        if len(keys) > 1:
            # Which key was the log's when the entry was written takes its history.
            print(
                f"note: {len(keys)} keys given and no --log: whether the key that signed this "
                "receipt was still the log's key when its entry was written (not retired by "
                "a rotation) is not checked; add --log LOGDIR"
            )
        return 0
    log = LogDirectory(args.log)
    inclusion = check_receipt_in_log(log, receipt, keys)
    size = inclusion.size
    print(f"ok: entry {receipt.index} is in the checkpoint of size {size}")
    dispatch = parse_record(inclusion.entry)
    if "data_class" in dispatch.data:  # records written before it existed name none
        policy, name = dispatch.data["policy"], dispatch.data["data_class"]
        print(
            f"ok: entry {receipt.index} records the decision of policy {shown(policy['id'])} "
            f"version {shown(policy['version'])} under data class "
            + ("(none)" if name is None else shown(name))
        )
    unsent = None
    if receipt.backend in pins and not dispatch.data["backend"].get("peer"):
        unsent = completion_that_sent_nothing(log, receipt, inclusion, receipt.backend)
    if unsent is not None:  # a keyless record of an attempt that sent nothing: no key
        print(
            f"ok: the attempt at backend {shown(receipt.backend)} sent nothing (entry "
            f"{unsent}, its completion: no connection, or its certificate refused), so "
            "there is no key to check"
        )
    elif check_pinned(dispatch, receipt.index, pins) is not None:
        print(
            f"ok: backend {shown(receipt.backend)} presented one of its "
            f"{len(pins[receipt.backend])} pinned key(s) on the connection that carried it"
        )
    check_receipt_key(log, envelope, receipt, keys, args.max_checkpoints)
    if statement is not None:
        index = check_countersignature_in_log(log, receipt, statement, inclusion)
        print(f"ok: entry {index}, its completion, recorded this countersignature")
    if bare:
        index, status = uncountersigned_error(log, receipt, inclusion)
        print(
            f"ok: entry {index}, its completion, says status {status}: an error answer, "
            "which no backend countersigns (the gateway's word alone)"
        )
        if args.request_body or args.response_body:
            print(
                "error: --request-body and --response-body check the backend's "
                "countersignature, and the receipt carries none (for the log's own "
                "commitments: owngate audit open --receipt --log)",
                file=sys.stderr,
            )
            return 2
    return 0


def _keys(verifiers: list[Verifier]) -> str:
    return ", ".join(f"the key {shown(str(verifier))}" for verifier in verifiers)
