"""`owngate audit`: verify a provenance log offline, prove, check receipts, open commitments.

Needs only `gateway.provenance` (standard library + cryptography): no server, no Redis.
Exit codes: 0 ok, 1 a check failed (the reason is printed), 2 usage error.
Every flag has an environment default `OWNGATE_AUDIT_<FLAG>`; keys and checkpoints given
through the environment are separated by whitespace or commas.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.provenance import (
    LogDirectory,
    ProvenanceError,
    TlogProof,
    Verifier,
    load_verifiers,
    receipt_version,
    verify_commitment,
    verify_log,
    verify_receipt,
)
from gateway.provenance.audit.attested import AttestedSummary, check_attestations, cross_check
from gateway.provenance.audit.receipt import (
    check_receipt_in_log,
    read_receipt,
    receipt_commitment,
)
from gateway.provenance.audit.remote import FetchLimits, is_url, mirror_log
from gateway.provenance.audit.report import Invocation, audit_report, verification_json
from gateway.provenance.audit.report_html import render_html
from gateway.provenance.audit.summary import Filters, summarise
from gateway.provenance.formats.attestation import receipt_countersignature
from gateway.provenance.formats.cosignature import CosignatureVerifier
from gateway.provenance.formats.layout import list_cosigned
from gateway.provenance.formats.merkle import inclusion_proof
from gateway.provenance.formats.records import parse_record
from gateway.provenance.formats.tiles import TileReader

__all__ = ["register"]


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"OWNGATE_AUDIT_{name}", default)


def _env_list(name: str) -> list[str]:
    value = _env(name) or ""
    return [item for item in value.replace(",", " ").split() if item]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="verify a provenance log offline",
        description="Verify a provenance log with nothing but its public key(s).",
        epilog="Exit codes: 0 ok, 1 a check failed, 2 usage error.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    _add_verify(verbs)
    _add_prove(verbs)
    _add_receipt(verbs)
    _add_open(verbs)
    _add_show(verbs)
    _add_report(verbs)
    parser.set_defaults(handler=lambda _args: _usage(parser))


Handler = Callable[[argparse.Namespace], int]


def _guarded(handler: Handler) -> Handler:
    """Failed checks exit 1 with their reason; unreadable input exits 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ProvenanceError as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return run


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _key_flag(parser: argparse.ArgumentParser, *, required: bool) -> None:
    defaults = _env_list("KEY")
    parser.add_argument(
        "--key",
        action="append",
        default=None,
        required=required and not defaults,
        metavar="VKEY",
        help="trusted verifier key (name+hexid+base64) or a file of them; repeat for "
        "rotated keys (env OWNGATE_AUDIT_KEY)",
    )
    parser.set_defaults(_key_defaults=defaults)


def _keys(args: argparse.Namespace) -> list[Verifier]:
    return load_verifiers(args.key or args._key_defaults)


def _add_verify(verbs: Any) -> None:
    verify = verbs.add_parser(
        "verify",
        help="check every entry, tile, checkpoint signature and link of a log",
        description="Recompute every leaf and the tree, check every checkpoint signature and "
        "the consistency of successive checkpoints, and every completion->dispatch link. "
        "Exits 1 naming the first bad entry and why.",
    )
    verify.add_argument(
        "logdir",
        help="the log directory, or the http(s) URL a log is served under as C2SP "
        "tlog-tiles (e.g. http://127.0.0.1:9090/log/, owngate's admin API)",
    )
    _token_flag(verify)
    _key_flag(verify, required=True)
    verify.add_argument(
        "--origin",
        default=_env("ORIGIN"),
        help="expected checkpoint origin line (env OWNGATE_AUDIT_ORIGIN)",
    )
    verify.add_argument(
        "--checkpoint",
        action="append",
        default=None,
        metavar="FILE",
        help="a checkpoint you saw before (from a receipt check, a witness or an earlier "
        "audit); the log must still contain it, which detects rollback "
        "(env OWNGATE_AUDIT_CHECKPOINT)",
    )
    verify.add_argument(
        "--witness-key",
        action="append",
        default=None,
        metavar="WVKEY",
        help="a witness's cosignature verifier key (`owngate witness vkey`); also checks the "
        "cosigned checkpoints in LOGDIR/cosigned/; repeat for several witnesses "
        "(env OWNGATE_AUDIT_WITNESS_KEY)",
    )
    verify.add_argument(
        "--min-witnesses",
        type=int,
        default=int(_env("MIN_WITNESSES", "1") or "1"),
        metavar="K",
        help="some checkpoint must be cosigned by at least K of the witness keys "
        "(env OWNGATE_AUDIT_MIN_WITNESSES, default 1)",
    )
    verify.add_argument(
        "--accept-earlier-keys",
        action="store_true",
        default=_env("ACCEPT_EARLIER_KEYS", "") in ("1", "true", "yes"),
        help="after a key rotation: the checkpoints before the first one a given key signed "
        "may be signed by keys you do not hold; their roots are still checked and the first "
        "trusted checkpoint covers their entries (env OWNGATE_AUDIT_ACCEPT_EARLIER_KEYS=1)",
    )
    verify.add_argument(
        "--backend-key",
        action="append",
        default=None,
        metavar="ID=VKEY",
        help="an attested backend's key (its `owngate attest` sidecar's verifier key): every "
        "answer the log says backend ID served must carry a valid countersignature by it over "
        "the same commitments; repeat per backend (env OWNGATE_AUDIT_BACKEND_KEY)",
    )
    verify.add_argument(
        "--attest-log",
        action="append",
        default=None,
        metavar="[ID=]DIR|URL",
        help="a sidecar's own statement log (directory, or URL served as tlog-tiles), "
        "cross-checked both ways against this log; ID= names its backend when several "
        "--backend-key are given (env OWNGATE_AUDIT_ATTEST_LOG)",
    )
    verify.add_argument("--json", action="store_true", help="print the summary as JSON")
    verify.set_defaults(
        handler=_guarded(_verify),
        _backend_key_defaults=_env_list("BACKEND_KEY"),
        _attest_log_defaults=_env_list("ATTEST_LOG"),
        _checkpoint_defaults=_env_list("CHECKPOINT"),
        _witness_defaults=_env_list("WITNESS_KEY"),
    )


def _token_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token",
        default=_env("TOKEN"),
        help="with a URL: the bearer token to send (an owngate admin token with the "
        "auditor role; env OWNGATE_AUDIT_TOKEN)",
    )
    parser.add_argument(
        "--max-download",
        type=int,
        default=_env("MAX_DOWNLOAD", str(FetchLimits().max_bytes)),  # type= converts it
        metavar="BYTES",
        help="with a URL: copy at most this many bytes in all (default 16 GiB; never more "
        "than the checkpoint's tree size can hold; env OWNGATE_AUDIT_MAX_DOWNLOAD)",
    )
    parser.add_argument(
        "--file-deadline",
        type=float,
        default=_env("FILE_DEADLINE", str(FetchLimits().file_deadline_s)),
        metavar="SECONDS",
        help="with a URL: each file must arrive whole within this (default 300; "
        "env OWNGATE_AUDIT_FILE_DEADLINE)",
    )


def _limits(args: argparse.Namespace) -> FetchLimits:
    return FetchLimits(file_deadline_s=args.file_deadline, max_bytes=args.max_download)


@contextlib.contextmanager
def _local_log(
    location: str,
    args: argparse.Namespace,
    verifiers: Sequence[Verifier] = (),
    origin: str | None = None,
) -> Iterator[str]:
    """A log directory for `location`: itself, or for an http(s) URL serving a log as
    C2SP tlog-tiles, a temporary copy of what its checkpoint covers (with `verifiers`,
    one that checkpoint is signed by)."""
    if not is_url(location):
        yield location
        return
    with tempfile.TemporaryDirectory(prefix="owngate-audit-") as copy:
        mirror_log(
            location,
            Path(copy),
            token=args.token,
            verifiers=verifiers,
            origin=origin,
            limits=_limits(args),
        )
        yield copy


def _verify(args: argparse.Namespace) -> int:
    files = args.checkpoint or args._checkpoint_defaults
    trusted = [Path(name).read_bytes() for name in files]
    witnesses = [_witness_key(text) for text in args.witness_key or args._witness_defaults]
    with _local_log(args.logdir, args, _keys(args), args.origin) as logdir:
        return _verified(args, logdir, trusted, witnesses)


def _verified(
    args: argparse.Namespace,
    logdir: str,
    trusted: list[bytes],
    witnesses: list[CosignatureVerifier],
) -> int:
    summary = verify_log(
        logdir,
        _keys(args),
        origin=args.origin,
        trusted_checkpoints=trusted,
        witnesses=witnesses,
        min_witnesses=args.min_witnesses,
        accept_earlier_keys=args.accept_earlier_keys,
    )
    attested = _attested(args, logdir, summary.size)
    witnessed = summary.witnesses
    if args.json:
        result: dict[str, Any] = {"ok": True, **verification_json(summary)}
        if attested is not None:
            result["attested"] = {"answers": attested.answers, "sidecars": attested.cross_checked}
        print(json.dumps(result))
        return 0
    earlier = (
        f" ({summary.earlier_checkpoints} earlier checkpoint(s) signed by keys not given)"
        if summary.earlier_checkpoints
        else ""
    )
    print(
        f"ok: {summary.origin}: {summary.size} entries, {summary.checkpoints} checkpoints, "
        f"signed by {', '.join(summary.signed_by)}{earlier}; "
        f"{summary.open_dispatches} dispatch(es) without completion, "
        f"{summary.unsigned_entries} entries not yet in a checkpoint"
    )
    if witnessed is not None:
        newest = ", ".join(f"{name} at {size}" for name, size in witnessed.newest_by.items())
        print(
            f"ok: witnessed: {witnessed.cosigned} cosigned checkpoint(s); entries "
            f"0..{witnessed.witnessed_size - 1} are cosigned by at least "
            f"{witnessed.min_witnesses} witness(es) ({newest}); "
            f"{summary.size - witnessed.witnessed_size} signed entries not yet witnessed"
        )
    if attested is not None:
        for backend, count in attested.answers.items():
            sidecar = attested.cross_checked.get(backend)
            unaccepted = attested.unaccepted.get(backend, 0)
            also = "" if sidecar is None else f"; its sidecar's log ({sidecar} entries) agrees"
            if unaccepted:
                also += (
                    f" ({unaccepted} statement(s) of requests the gateway dispatched there "
                    "hold no accepted countersignature in its log: see their records)"
                )
            print(f"ok: backend {backend}: {count} answer(s) countersigned by its key{also}")
    return 0


def backend_keys(items: list[str]) -> dict[str, Verifier]:
    """`ID=VKEY` items (a VKEY may be a file holding the key) as backend id -> verifier."""
    keys: dict[str, Verifier] = {}
    for item in items:
        backend, sep, key = item.partition("=")
        if not sep or not backend or not key:
            raise ValueError(f"--backend-key wants ID=VKEY, not {item!r}")
        found = load_verifiers([key])
        if len(found) != 1:
            raise ValueError(f"--backend-key {backend}: give exactly one key")
        keys[backend] = found[0]
    return keys


def _attested(args: argparse.Namespace, logdir: str, size: int) -> AttestedSummary | None:
    keys = backend_keys(args.backend_key or args._backend_key_defaults)
    sidecars = args.attest_log or args._attest_log_defaults
    if not keys:
        if sidecars:
            raise ValueError("--attest-log needs the sidecar's --backend-key ID=VKEY")
        return None
    summary = check_attestations(logdir, size, keys)
    for item in sidecars:
        backend, sep, where = item.partition("=")
        if not sep or backend not in keys:
            if len(keys) != 1:
                raise ValueError(f"--attest-log {item!r}: name its backend, ID=DIR")
            backend, where = next(iter(keys)), item
        if is_url(where):
            with tempfile.TemporaryDirectory(prefix="owngate-attest-") as copy:
                limits = _limits(args)
                mirror_log(where, Path(copy), verifiers=[keys[backend]], limits=limits)
                cross_check(summary, copy, backend, keys[backend])
        else:
            cross_check(summary, where, backend, keys[backend])
    return summary


def _witness_key(text: str) -> CosignatureVerifier:
    """A witness key given directly, or the first key line of a file."""
    if "+" not in text and Path(text).is_file():
        lines = [line.strip() for line in Path(text).read_text().splitlines()]
        text = next((line for line in lines if line and not line.startswith("#")), "")
    return CosignatureVerifier(text)


def _add_prove(verbs: Any) -> None:
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
        default=_env("RECORD", "dispatch"),
        help="which record of the request (env OWNGATE_AUDIT_RECORD, default dispatch)",
    )
    prove.add_argument(
        "--cosigned",
        action="store_true",
        help="prove against the newest witness-cosigned checkpoint (LOGDIR/cosigned/) that "
        "covers the record, so the proof carries the witnesses' cosignatures",
    )
    prove.set_defaults(handler=_guarded(_prove))


def _prove(args: argparse.Namespace) -> int:
    log = LogDirectory(args.logdir)
    note = log.latest_note()
    size = _unverified_size(note)
    matches = [(i, r) for i, r in log.find_request(args.request_id, size) if r.type == args.record]
    if not matches:
        print(f"error: no {args.record} record of {args.request_id!r} in the log", file=sys.stderr)
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
        note = path.read_bytes()
    entry = log.bundle(index // 256, size)[index % 256]
    hashes = inclusion_proof(index, size, TileReader(log.path, size).node)
    sys.stdout.write(TlogProof(index, tuple(hashes), note, extra=entry).format())
    return 0


def _unverified_size(note: bytes) -> int:
    """Tree size of a checkpoint note before any key check (the verifier checks later)."""
    lines = note.decode("utf-8", "replace").split("\n")
    if len(lines) < 3 or not lines[1].isdecimal():
        raise ProvenanceError("the log's checkpoint file is not a checkpoint")
    return int(lines[1])


def _add_receipt(verbs: Any) -> None:
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
    _key_flag(verify, required=True)
    verify.add_argument("--log", default=_env("LOG"), help="log directory (env OWNGATE_AUDIT_LOG)")
    verify.add_argument(
        "--backend-key",
        action="append",
        default=None,
        metavar="ID=VKEY",
        help="an attested backend's key: a receipt naming backend ID must carry its valid "
        "countersignature for this request (env OWNGATE_AUDIT_BACKEND_KEY)",
    )
    verify.set_defaults(
        handler=_guarded(_receipt_verify), _backend_key_defaults=_env_list("BACKEND_KEY")
    )
    receipt.set_defaults(handler=lambda _args: _usage(receipt))


def _receipt_verify(args: argparse.Namespace) -> int:
    keys = _keys(args)
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
        envelope, receipt, backend_keys(args.backend_key or args._backend_key_defaults)
    )
    if statement is not None:
        print(
            f"ok: countersigned by backend {receipt.backend}'s key {statement.key} "
            f"(counter {statement.counter})"
        )
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


def _add_open(verbs: Any) -> None:
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
        default=_env("KIND", "request"),
        help="which body this is (env OWNGATE_AUDIT_KIND, default request)",
    )
    opener.add_argument("--salt", default=_env("SALT"), help="salt, hex (env OWNGATE_AUDIT_SALT)")
    opener.add_argument(
        "--commitment", default=_env("COMMITMENT"), help="hex (env OWNGATE_AUDIT_COMMITMENT)"
    )
    opener.add_argument(
        "--receipt",
        default=_env("RECEIPT"),
        help="take the salt from this receipt and the commitment from --log "
        "(env OWNGATE_AUDIT_RECEIPT)",
    )
    opener.add_argument("--log", default=_env("LOG"), help="log directory (env OWNGATE_AUDIT_LOG)")
    _key_flag(opener, required=False)
    opener.set_defaults(handler=_guarded(_open))


def _open(args: argparse.Namespace) -> int:
    body = Path(args.body).read_bytes()
    salt_hex, commitment = args.salt, args.commitment
    if args.receipt is not None:
        if args.log is None or not (args.key or args._key_defaults):
            print("error: --receipt needs --log and --key", file=sys.stderr)
            return 2
        receipt = verify_receipt(read_receipt(args.receipt), _keys(args))
        salts = receipt.salts
        salt_hex = (salts.request if args.kind == "request" else salts.response).hex()
        commitment = receipt_commitment(LogDirectory(args.log), receipt, args.kind, _keys(args))
    if salt_hex is None or commitment is None:
        print("error: give --salt and --commitment, or --receipt and --log", file=sys.stderr)
        return 2
    verify_commitment(args.kind, commitment, bytes.fromhex(salt_hex), body)
    print(f"ok: {args.body} with this salt opens the {args.kind} commitment {commitment}")
    return 0


def _add_show(verbs: Any) -> None:
    show = verbs.add_parser(
        "show",
        help="summarise requests per backend and region, fallbacks and refusals",
        description="Summarise the records of a log (up to its latest checkpoint). This does "
        "not verify the log: run `owngate audit verify` first.",
    )
    show.add_argument("logdir", help="the log directory, or its http(s) URL (as for verify)")
    _token_flag(show)
    show.add_argument("--tenant", default=_env("TENANT"), help="env OWNGATE_AUDIT_TENANT")
    show.add_argument("--backend", default=_env("BACKEND"), help="env OWNGATE_AUDIT_BACKEND")
    show.add_argument(
        "--since", default=_env("SINCE"), help="ISO 8601 time, inclusive (env OWNGATE_AUDIT_SINCE)"
    )
    show.add_argument(
        "--until", default=_env("UNTIL"), help="ISO 8601 time, exclusive (env OWNGATE_AUDIT_UNTIL)"
    )
    show.add_argument("--records", action="store_true", help="also list the matching records")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=_guarded(_show))


def _time(value: str | None) -> datetime | None:
    if value is None:
        return None
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError(f"time {value!r} needs a timezone (e.g. Z or +00:00)")
    return moment


def _show(args: argparse.Namespace) -> int:
    try:
        filters = Filters(args.tenant, args.backend, _time(args.since), _time(args.until))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with _local_log(args.logdir, args) as logdir:
        log = LogDirectory(logdir)
        size = _unverified_size(log.latest_note())
        summary = summarise(log.records(size), filters, keep_records=args.records)
    if args.json:
        result = summary.as_dict()
        if args.records:
            result["records"] = [{"index": i, **r.data} for i, r in summary.records]
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    print(
        f"{summary.dispatched} dispatched, {summary.completed} completed, "
        f"{summary.refused} refused (of {size} entries)"
    )
    header = ("BACKEND", "REGION", "TIER", "DISPATCHED", "FALLBACKS", "COMPLETED", "ERRORS")
    rows: list[tuple[str, ...]] = [header]
    for r in summary.backends.values():
        counts = (r.dispatched, r.fallbacks, r.completed, r.errors)
        rows.append((r.backend, r.region, r.tier, *(str(n) for n in counts)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    for title, counter in (
        ("region", summary.regions()),
        ("fallback", summary.fallback_reasons),
        ("refusal", summary.refusal_rules),
    ):
        for reason, count in counter.most_common():
            print(f"{title}: {count} x {reason}")
    for index, record in summary.records:
        print(f"{index}: {json.dumps(record.data, sort_keys=True)}")
    return 0


def _add_report(verbs: Any) -> None:
    report = verbs.add_parser(
        "report",
        help="verify a log and write an auditor's report (self-contained HTML and/or JSON)",
        description="Run the checks of `owngate audit verify` (same flags), then write "
        "dispatches per backend and region, requests per tenant over time, fallback and "
        "refusal rates, checkpoints and cosignatures, each with the command that reproduces "
        "it. A log that fails verification gets a report that says so, without figures, "
        "and exit code 1. LOGDIR may be a URL serving the log as C2SP tlog-tiles, as for "
        "verify.",
    )
    report.add_argument("logdir", help="the log directory, or its http(s) URL (as for verify)")
    _token_flag(report)
    _verify_flags(report)
    report.add_argument(
        "--html",
        metavar="FILE",
        help="write the report as one self-contained HTML file ('-': standard output)",
    )
    report.add_argument(
        "--json", metavar="FILE", help="write the same numbers as JSON ('-': standard output)"
    )
    report.set_defaults(
        handler=_guarded(_report),
        _checkpoint_defaults=_env_list("CHECKPOINT"),
        _witness_defaults=_env_list("WITNESS_KEY"),
    )


def _write(name: str, text: str) -> None:
    """Write a report to file `name`, or to standard output for '-'."""
    if name == "-":
        sys.stdout.write(text)
    else:
        Path(name).write_text(text, encoding="utf-8")


def _verify_flags(parser: argparse.ArgumentParser) -> None:
    """The trust flags of `verify`, with the same meaning and environment defaults."""
    _key_flag(parser, required=True)
    same = "as for `owngate audit verify`"
    parser.add_argument("--origin", default=_env("ORIGIN"), help=f"expected origin, {same}")
    for flag in ("--checkpoint", "--witness-key"):
        parser.add_argument(flag, action="append", default=None, help=same)
    parser.add_argument(
        "--min-witnesses",
        type=int,
        default=int(_env("MIN_WITNESSES", "1") or "1"),
        metavar="K",
        help=same,
    )
    parser.add_argument(
        "--accept-earlier-keys",
        action="store_true",
        default=_env("ACCEPT_EARLIER_KEYS", "") in ("1", "true", "yes"),
        help=same,
    )


def _report(args: argparse.Namespace) -> int:
    if args.html is None and args.json is None:
        print("error: give --html FILE and/or --json FILE", file=sys.stderr)
        return 2
    witness_texts = args.witness_key or args._witness_defaults
    flags = [arg for key in args.key or args._key_defaults for arg in ("--key", key)]
    flags += [arg for text in witness_texts for arg in ("--witness-key", text)]
    checkpoints = args.checkpoint or args._checkpoint_defaults
    flags += [arg for name in checkpoints for arg in ("--checkpoint", name)]
    if args.origin is not None:
        flags += ["--origin", args.origin]
    if witness_texts:
        flags += ["--min-witnesses", str(args.min_witnesses)]
    if args.accept_earlier_keys:
        flags.append("--accept-earlier-keys")
    # Not verified while copying: a checkpoint the keys do not sign is the report's finding.
    with _local_log(args.logdir, args) as logdir:
        result = audit_report(
            logdir,
            _keys(args),
            Invocation(args.logdir, tuple(flags)),
            origin=args.origin,
            trusted_checkpoints=[Path(name).read_bytes() for name in checkpoints],
            witnesses=[_witness_key(text) for text in witness_texts],
            min_witnesses=args.min_witnesses,
            accept_earlier_keys=args.accept_earlier_keys,
            now=time.time(),
        )
    if args.json is not None:
        _write(args.json, json.dumps(result, indent=2) + "\n")
    if args.html is not None:
        _write(args.html, render_html(result))
    verification = result["verification"]
    if not verification["ok"]:
        print(f"FAILED: {verification['error']} (the report says so)", file=sys.stderr)
        return 1
    return 0
