"""`owngate audit proof verify`: check a C2SP tlog-proof file (from `owngate audit prove`,
`GET /v1/provenance/proofs/{id}` or the admin API) offline, with the log's key."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from gateway.cli.audit_flags import (
    env,
    env_list,
    guarded,
    key_flag,
    trusted_keys,
    usage,
    witness_key,
)
from gateway.provenance import verify_receipt
from gateway.provenance.audit.proof import MAX_PROOF_BYTES, check_tlog_proof
from gateway.provenance.audit.receipt import read_receipt
from gateway.provenance.audit.receipt_keys import check_receipt_log_key
from gateway.provenance.audit.shown import quoted, shown
from gateway.small_files import read_file_head

__all__ = ["add_proof"]


def add_proof(verbs: Any) -> None:
    proof = verbs.add_parser("proof", help="check a C2SP tlog-proof file")
    actions = proof.add_subparsers(dest="action", metavar="ACTION")
    verify = actions.add_parser(
        "verify",
        help="check that a .tlog-proof proves its entry is in a signed checkpoint",
        description="Check a c2sp.org/tlog-proof@v1 file: its checkpoint's signature by a "
        "trusted key, the inclusion proof of the entry at its index against that "
        "checkpoint's root, and with --witness-key the witnesses' cosignatures. The entry "
        "is --entry, or the receipt's record (--receipt), else the proof's extra line.",
    )
    verify.add_argument("file", help="the proof (.tlog-proof)")
    key_flag(verify, required=True)
    verify.add_argument(
        "--origin",
        default=env("ORIGIN"),
        help="expected checkpoint origin line (env OWNGATE_AUDIT_ORIGIN)",
    )
    verify.add_argument(
        "--entry",
        default=env("ENTRY"),
        metavar="FILE",
        help="the entry's bytes (a record as the log holds it): the proof must be of exactly "
        "it, and its extra line, when it has one, must be it (env OWNGATE_AUDIT_ENTRY)",
    )
    verify.add_argument(
        "--receipt",
        default=env("RECEIPT"),
        metavar="FILE",
        help="a receipt signed by --key: the proof must be of the record it names, at its "
        "index, in its log (env OWNGATE_AUDIT_RECEIPT)",
    )
    verify.add_argument(
        "--witness-key",
        action="append",
        default=None,
        metavar="WVKEY",
        help="a witness's cosignature verifier key; the proof's checkpoint must carry "
        "--min-witnesses of them (env OWNGATE_AUDIT_WITNESS_KEY)",
    )
    verify.add_argument(
        "--min-witnesses",
        type=int,
        default=int(env("MIN_WITNESSES", "1") or "1"),
        metavar="K",
        help="cosignatures needed, of the witness keys given "
        "(env OWNGATE_AUDIT_MIN_WITNESSES, default 1)",
    )
    verify.set_defaults(handler=guarded(_proof_verify), _witness_defaults=env_list("WITNESS_KEY"))
    proof.set_defaults(handler=lambda _args: usage(proof))


def _read(path: str, limit: int) -> bytes:
    # one byte more, which the check refuses; a FIFO is refused, not waited on
    return read_file_head(Path(path), limit + 1)


def _proof_verify(args: argparse.Namespace) -> int:
    keys = trusted_keys(args)
    witnesses = [witness_key(text) for text in args.witness_key or args._witness_defaults]
    origin, receipt = args.origin, None
    if args.receipt is not None:
        envelope = read_receipt(args.receipt)
        receipt = verify_receipt(envelope, keys)
        if origin is not None and origin != receipt.log:
            raise ValueError(
                f"--origin {quoted(origin)} is not the receipt's log {quoted(receipt.log)}"
            )
        origin = receipt.log
        signers, named = check_receipt_log_key(envelope, receipt, keys)
        print(
            f"ok: receipt for request {shown(receipt.request_id)} of the log "
            f"{shown(receipt.log)} signed by "
            + ", ".join(f"the key {shown(str(signer))}" for signer in signers)
        )
        if not named:
            print(
                f"note: no key that signed it is named for the log {shown(receipt.log)} (a "
                "log's key carries its origin as its name), so that the receipt is that "
                "log's is the receipt's own claim, not checked (`owngate audit receipt "
                "verify --log LOGDIR` checks it against the log's checkpoints)"
            )
    entry = None if args.entry is None else _read(args.entry, MAX_PROOF_BYTES)
    proved = check_tlog_proof(
        _read(args.file, MAX_PROOF_BYTES),
        keys,
        origin=origin,
        entry=entry,
        receipt=receipt,
        witnesses=witnesses,
        min_witnesses=args.min_witnesses,
        now=time.time(),
    )
    checkpoint = proved.checkpoint
    what = "its extra line" if proved.from_extra else "the entry given"
    if proved.entry is None:
        what = "the receipt's record"
    print(
        f"ok: entry {proved.index} ({what}, leaf hash {proved.leaf.hex()}) is in the "
        f"checkpoint of {quoted(checkpoint.origin)} of size {checkpoint.size}, signed by "
        f"{', '.join(shown(name) for name in proved.signed_by)}"
    )
    if receipt is not None and proved.claims_checked:
        print(
            f"ok: that record is the receipt's: request {shown(receipt.request_id)}, "
            + (f"backend {shown(receipt.backend)}" if receipt.backend else "a refusal")
            + f", policy {shown(receipt.policy_digest)}"
        )
    elif receipt is not None:
        print(
            "note: the proof carries no record (no extra line), so only the receipt's "
            "dispatch_hash is proved: its request, backend and policy are not checked "
            "against the log's record; give --entry FILE (the record) or run `owngate "
            "audit receipt verify --log LOGDIR`"
        )
    if witnesses:
        print(
            f"ok: that checkpoint is cosigned by {len(proved.cosigned_by)} of the "
            f"{len(witnesses)} witness key(s) (at least {args.min_witnesses} needed): "
            f"{', '.join(shown(name) for name in proved.cosigned_by)}"
        )
    return 0
