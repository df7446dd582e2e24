"""`owngate audit verify`: every entry, tile, checkpoint signature and link of a log, with
`--backend-pin` the keys its pinned backends presented, and with `--backend-key` /
`--attest-log` its two-party statements."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from gateway.cli.audit_flags import (
    backend_keys,
    backend_pins,
    env,
    env_list,
    fetch_limits,
    guarded,
    key_flag,
    local_log,
    max_checkpoints_flag,
    saved_checkpoint,
    token_flag,
    trusted_keys,
    witness_key,
)
from gateway.provenance import (
    verify_log,
)
from gateway.provenance.audit.attested import AttestedSummary, check_attestations, cross_check
from gateway.provenance.audit.pinned import PinnedSummary, check_pins
from gateway.provenance.audit.reader import read_settled
from gateway.provenance.audit.remote import is_url, mirror_log
from gateway.provenance.audit.report import verification_json
from gateway.provenance.audit.shown import quoted, shown
from gateway.provenance.audit.verify import HistoryLimits, LogSummary
from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.cosignature import CosignatureVerifier
from gateway.provenance.formats.layout import MAX_HISTORY_BYTES

__all__ = ["add_verify"]


def add_verify(verbs: Any) -> None:
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
    token_flag(verify)
    key_flag(verify, required=True)
    verify.add_argument(
        "--origin",
        default=env("ORIGIN"),
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
        default=int(env("MIN_WITNESSES", "1") or "1"),
        metavar="K",
        help="some checkpoint must be cosigned by at least K of the witness keys "
        "(env OWNGATE_AUDIT_MIN_WITNESSES, default 1)",
    )
    verify.add_argument(
        "--accept-earlier-keys",
        action="store_true",
        default=env("ACCEPT_EARLIER_KEYS", "") in ("1", "true", "yes"),
        help="after a key rotation: the checkpoints before the first one a given key signed "
        "may be signed by keys you do not hold; their roots are still checked and the first "
        "trusted checkpoint covers their entries (env OWNGATE_AUDIT_ACCEPT_EARLIER_KEYS=1)",
    )
    verify.add_argument(
        "--backend-pin",
        action="append",
        default=None,
        metavar="ID=PIN",
        help="a key backend ID's owner publishes (sha256//base64, as tls.pin_spki_sha256): "
        "every dispatch the log says went to ID must name, as the key the backend presented "
        "on its connection, one of the pins given for ID (a record naming none, as over "
        "plain HTTP, fails); repeat for several backends, or for several keys of one across "
        "a rotation (env OWNGATE_AUDIT_BACKEND_PIN)",
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
    verify.add_argument(
        "--attest-checkpoint",
        action="append",
        default=None,
        metavar="[ID=]FILE",
        help="a checkpoint of a sidecar's log you saw before (its /log/checkpoint, saved at "
        "an earlier audit): its --attest-log must still contain it, which detects a rollback "
        "of the sidecar's log; ID= names its backend when several --backend-key are given "
        "(env OWNGATE_AUDIT_ATTEST_CHECKPOINT)",
    )
    verify.add_argument(
        "--replica-log",
        action="append",
        default=None,
        metavar="DIR|URL",
        help="the log of another replica of this gateway (its key among --key): its "
        "two-party statements are checked with this log's, as one (a counter used in both is "
        "a replay), and every --attest-log is cross-checked against them all; repeat per "
        "replica (env OWNGATE_AUDIT_REPLICA_LOG)",
    )
    max_checkpoints_flag(verify, "checkpoints/ (and in cosigned/)")
    verify.add_argument(
        "--max-history-bytes",
        type=int,
        default=int(env("MAX_HISTORY_BYTES", str(MAX_HISTORY_BYTES)) or MAX_HISTORY_BYTES),
        metavar="BYTES",
        help="hold at most BYTES of checkpoints/ notes; more fails the audit (env "
        f"OWNGATE_AUDIT_MAX_HISTORY_BYTES, default {MAX_HISTORY_BYTES})",
    )
    verify.add_argument("--json", action="store_true", help="print the summary as JSON")
    verify.set_defaults(
        handler=guarded(_verify),
        _backend_key_defaults=env_list("BACKEND_KEY"),
        _backend_pin_defaults=env_list("BACKEND_PIN"),
        _attest_log_defaults=env_list("ATTEST_LOG"),
        _attest_checkpoint_defaults=env_list("ATTEST_CHECKPOINT"),
        _replica_log_defaults=env_list("REPLICA_LOG"),
        _checkpoint_defaults=env_list("CHECKPOINT"),
        _witness_defaults=env_list("WITNESS_KEY"),
    )


def _verify(args: argparse.Namespace) -> int:
    backend_pins(args.backend_pin or args._backend_pin_defaults)  # refused before any work
    files = args.checkpoint or args._checkpoint_defaults
    trusted = [saved_checkpoint(name) for name in files]
    witnesses = [witness_key(text) for text in args.witness_key or args._witness_defaults]
    with local_log(args.logdir, args, trusted_keys(args), args.origin) as logdir:
        return _verified(args, logdir, trusted, witnesses)


def _verified(
    args: argparse.Namespace,
    logdir: str,
    trusted: list[bytes],
    witnesses: list[CosignatureVerifier],
) -> int:
    summary = read_settled(  # a live gateway's log may take a checkpoint meanwhile
        logdir,
        lambda: verify_log(
            logdir,
            trusted_keys(args),
            origin=args.origin,
            trusted_checkpoints=trusted,
            witnesses=witnesses,
            min_witnesses=args.min_witnesses,
            accept_earlier_keys=args.accept_earlier_keys,
            limits=HistoryLimits(args.max_checkpoints, args.max_history_bytes),
        ),
    )
    pins = backend_pins(args.backend_pin or args._backend_pin_defaults)
    pinned = check_pins(logdir, summary.size, pins, root=summary.root) if pins else None
    attested = _attested(args, logdir, summary)
    witnessed = summary.witnesses
    if args.json:
        result: dict[str, Any] = {"ok": True, **verification_json(summary)}
        if pinned is not None:
            result["pinned"] = pinned.dispatches
            result["pinned_unsent"] = pinned.unsent
        if attested is not None:
            result["attested"] = {
                "answers": attested.answers,
                "sidecars": attested.cross_checked,
                "unkeyed": attested.unkeyed,
                "replicas": [{"origin": o, "size": n} for o, n in attested.replicas],
            }
        print(json.dumps(result))
        return 0
    earlier = (
        f" ({summary.earlier_checkpoints} earlier checkpoint(s) signed by keys not given)"
        if summary.earlier_checkpoints
        else ""
    )
    print(
        f"ok: {shown(summary.origin)}: {summary.size} entries, {summary.checkpoints} "
        f"checkpoints, signed by {', '.join(shown(name) for name in summary.signed_by)}"
        f"{earlier}; "
        f"{summary.open_dispatches} dispatch(es) without completion, "
        f"{summary.unsigned_entries} entries not yet in a checkpoint"
    )
    if witnessed is not None:
        newest = ", ".join(f"{shown(name)} at {size}" for name, size in witnessed.newest_by.items())
        print(
            f"ok: witnessed: {witnessed.cosigned} cosigned checkpoint(s); entries "
            f"0..{witnessed.witnessed_size - 1} are cosigned by at least "
            f"{witnessed.min_witnesses} witness(es) ({newest}); "
            f"{summary.size - witnessed.witnessed_size} signed entries not yet witnessed"
        )
    if pinned is not None:
        _print_pinned(pinned, pins)
    if attested is not None:
        for origin, size in attested.replicas:
            print(f"ok: replica log {quoted(origin)}: {size} entries, checked with this one")
        for backend, count in attested.answers.items():
            sidecar = attested.cross_checked.get(backend)
            unaccepted = attested.unaccepted.get(backend, 0)
            also = "" if sidecar is None else f"; its sidecar's log ({sidecar} entries) agrees"
            if unaccepted:
                also += (
                    f" ({unaccepted} statement(s) of requests the gateway dispatched there "
                    "hold no accepted countersignature in its log: see their records)"
                )
            if not attested.dispatched.get(backend):
                also += " (the log dispatched nothing to it: is the id right?)"
            print(f"ok: backend {shown(backend)}: {count} answer(s) countersigned by its key{also}")
        if attested.unkeyed:
            # The log's ids, quoted: a compromised gateway's log is not to write to a terminal.
            named = ", ".join(f"{quoted(b)} ({n})" for b, n in sorted(attested.unkeyed.items()))
            print(
                f"note: answers of private backends given no --backend-key, the gateway's word "
                f"alone: {named}"
            )
    return 0


def _print_pinned(pinned: PinnedSummary, pins: dict[str, frozenset[str]]) -> None:
    for backend, count in pinned.dispatches.items():
        unsent = pinned.unsent.get(backend, 0)
        none = (
            " (the log dispatched nothing to it: is the id right?)"
            if not count and not unsent
            else ""
        )
        refused = (
            f"; {unsent} more attempt(s) sent nothing (no connection: refused, or its "
            "certificate was)"
            if unsent
            else ""
        )
        print(
            f"ok: backend {shown(backend)}: {count} dispatch(es), each over a connection "
            f"presenting one of its {len(pins[backend])} pinned key(s){refused}{none}"
        )


def _attested(
    args: argparse.Namespace, logdir: str, verified: LogSummary
) -> AttestedSummary | None:
    keys = backend_keys(args.backend_key or args._backend_key_defaults, trusted_keys(args))
    sidecars = args.attest_log or args._attest_log_defaults
    seen = args.attest_checkpoint or args._attest_checkpoint_defaults
    replicas = args.replica_log or args._replica_log_defaults
    if not keys:
        if sidecars or seen or replicas:
            flag = "--replica-log" if replicas and not (sidecars or seen) else "--attest-log"
            raise ValueError(f"{flag} needs the sidecar's --backend-key ID=VKEY")
        return None
    trusted: dict[str, list[bytes]] = {}
    for item in seen:
        backend, where = _backend_of(item, keys, "--attest-checkpoint")
        trusted.setdefault(backend, []).append(saved_checkpoint(where))
    summary = check_attestations(logdir, verified.size, keys, root=verified.root)
    for where in replicas:
        _add_replica(args, where, keys, summary, verified.origin)
    for item in sidecars:
        backend, where = _backend_of(item, keys, "--attest-log")
        held = trusted.pop(backend, [])
        if is_url(where):
            with tempfile.TemporaryDirectory(prefix="owngate-attest-") as copy:
                limits = fetch_limits(args)
                mirror_log(where, Path(copy), verifiers=[keys[backend]], limits=limits)
                cross_check(summary, copy, backend, keys[backend], trusted_checkpoints=held)
        else:
            cross_check(summary, where, backend, keys[backend], trusted_checkpoints=held)
    if trusted:
        raise ValueError(
            f"--attest-checkpoint for backend {shown(min(trusted))} needs its --attest-log: the "
            "checkpoint is checked against the sidecar's log"
        )
    return summary


def _add_replica(
    args: argparse.Namespace,
    where: str,
    keys: dict[str, Any],
    summary: AttestedSummary,
    origin: str,
) -> None:
    """Verify another replica's log (signed by one of --key) and add its two-party
    statements to `summary`; `origin`: the audited log's (each replica has its own)."""
    with local_log(where, args, trusted_keys(args)) as replica:
        try:
            checked = read_settled(
                replica,
                lambda: verify_log(
                    replica, trusted_keys(args), accept_earlier_keys=args.accept_earlier_keys
                ),
            )
            if checked.origin in (origin, *(seen for seen, _ in summary.replicas)):
                raise ValueError(
                    f"--replica-log {shown(where)}: the log {quoted(checked.origin)} is given "
                    "twice (each replica writes a log of its own origin)"
                )
            check_attestations(replica, checked.size, keys, summary, root=checked.root)
        except LogVerificationError as exc:
            raise LogVerificationError(f"replica log {shown(where)}: {exc}") from exc
        summary.replicas.append((checked.origin, checked.size))


def _backend_of(item: str, keys: dict[str, Any], flag: str) -> tuple[str, str]:
    """(backend id, location) of an `[ID=]WHERE` flag value; the ID may be left out when
    one backend key is given."""
    backend, sep, where = item.partition("=")
    if not sep or backend not in keys:
        if len(keys) != 1:
            raise ValueError(f"{flag} {quoted(item)}: name its backend, ID={shown(where or item)}")
        backend, where = next(iter(keys)), item
    return backend, where
