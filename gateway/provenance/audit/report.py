"""What `owngate audit report` shows, as numbers: a verified log folded into figures.

`audit_report` runs the same `verify_log` as `owngate audit verify`; only when the log
verifies does it read the entries again (checking that they still hash to the verified
root) and count them. A log that fails gets a report that holds the failure and no
figures. The result is a plain JSON-ready dict of a documented, stable shape (format
`REPORT_FORMAT`, docs/provenance.md "Auditor report"); `report_html` draws it.

Each figure carries the commands that reproduce its numbers without this module: `jq`
over `owngate audit show LOGDIR --records --json` (which lists every record with its
index). So the definitions here are kept to what a short `jq` filter can say:

* time buckets are `bucket_seconds` wide and aligned to the Unix epoch; a record's time
  is truncated to the second (`jq`: `.time[:19]+"Z" | fromdateiso8601`);
* a dispatch is one attempt at one backend (a retried request has several);
* a request is one request id with a dispatch or refusal record, counted at its first
  such record (the tenant and time of that record);
* a fallback is a dispatch whose `fallback` is not null; its rate is over dispatches;
* a refusal's rule is its `rule`; its rate is over requests;
* a checkpoint's time is the time of the newest entry it covers (checkpoints carry no
  time; it was signed at or after it); a cosignature's time is the witness's timestamp.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.verify import LogSummary, verify_log
from gateway.provenance.errors import LogVerificationError, MalformedError, SignatureError
from gateway.provenance.formats.cosignature import CosignatureVerifier, find_cosignature
from gateway.provenance.formats.layout import list_cosigned
from gateway.provenance.formats.merkle import CompactRange, leaf_hash
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.records import Record, parse_record

__all__ = [
    "BUCKET_SECONDS",
    "MAX_BUCKETS",
    "REPORT_FORMAT",
    "Invocation",
    "audit_report",
    "bucket_seconds",
    "figures",
]

REPORT_FORMAT = "owngate-audit-report/1"
MAX_BUCKETS = 60
# Bucket widths, smallest first: the report takes the first that spans the log's records
# in at most MAX_BUCKETS buckets (a week per bucket beyond that).
BUCKET_SECONDS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
BUCKET_SECONDS += (7200, 10800, 21600, 43200, 86400, 604800)
_SHOW = "owngate audit show {logdir} --records --json"
_BUCKET = '((.time[:19]+"Z"|fromdateiso8601) as $t | $t - $t % {width} | todate)'
_COUNTS = "group_by([.key,.bucket]) | map(.[0] + {count: length})"


@dataclass(frozen=True, slots=True)
class Invocation:
    """How the auditor ran the report: the log and the `verify` flags, for the commands
    each figure prints (`verify_flags` as given, e.g. ["--key", "KEY"])."""

    logdir: str
    verify_flags: tuple[str, ...] = ()

    def verify(self, *extra: str) -> str:
        return shlex.join(["owngate", "audit", "verify", self.logdir, *self.verify_flags, *extra])

    def jq(self, program: str) -> str:
        return f"{_SHOW.format(logdir=shlex.quote(self.logdir))} | jq -c {shlex.quote(program)}"

    def report(self, path: str) -> str:
        argv = ["owngate", "audit", "report", self.logdir, *self.verify_flags, "--json", "-"]
        return f"{shlex.join(argv)} | jq {shlex.quote(path)}"


def _seconds(time: str) -> int:
    """A record time (`2026-01-31T12:00:00.250Z`) as POSIX seconds, truncated."""
    return int(datetime.fromisoformat(time[:19] + "+00:00").timestamp())


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bucket_seconds(first: int, last: int) -> int:
    """The smallest width that covers `first..last` (POSIX seconds) in MAX_BUCKETS."""
    for width in BUCKET_SECONDS:
        if last // width - first // width < MAX_BUCKETS:
            return width
    return BUCKET_SECONDS[-1]


def _counts(found: Iterable[tuple[str, int]], width: int) -> list[dict[str, Any]]:
    """(key, seconds) pairs as sorted {key, bucket, count} rows, as `jq` group_by gives."""
    tally = Counter((key, _iso(moment - moment % width)) for key, moment in found)
    return [{"key": k, "bucket": b, "count": n} for (k, b), n in sorted(tally.items())]


def _totals(counts: list[dict[str, Any]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for row in counts:
        totals[row["key"]] += row["count"]
    return dict(sorted(totals.items(), key=lambda item: (-item[1], item[0])))


def _series(
    title: str, what: str, found: list[tuple[str, int]], width: int, selector: str, run: Invocation
) -> dict[str, Any]:
    counts = _counts(found, width)
    program = f"{selector} | {_COUNTS}"
    return {
        "title": title,
        "description": what,
        "totals": _totals(counts),
        "counts": counts,
        "commands": [run.jq(program.replace("{width}", str(width)))],
    }


def _rates(counts: dict[str, int], total: int) -> list[dict[str, Any]]:
    return [
        {"key": key, "count": count, "rate": count / total if total else 0.0}
        for key, count in sorted(counts.items())
    ]


def figures(
    records: Sequence[tuple[int, Record]],
    checkpoint_sizes: Sequence[int],
    cosignatures: Sequence[tuple[int, str, int]],
    run: Invocation,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(totals, figures) of verified records in log order, the history's checkpoint sizes
    and the verified cosignatures as (size, witness, timestamp)."""
    moments = [_seconds(record.time) for _, record in records]
    width = bucket_seconds(min(moments), max(moments)) if moments else BUCKET_SECONDS[0]
    dispatches: list[tuple[Record, int]] = []
    first_of: dict[str, tuple[str, int]] = {}  # request id -> (tenant, seconds), first record
    refusals: list[tuple[str, int]] = []
    for (_, record), moment in zip(records, moments, strict=True):
        if record.type == "completion":
            continue
        first_of.setdefault(record.request_id, (record.data["tenant"], moment))
        if record.type == "dispatch":
            dispatches.append((record, moment))
        else:
            refusals.append((record.data["rule"], moment))
    fallbacks = [(r.data["fallback"], m) for r, m in dispatches if r.data["fallback"] is not None]
    bucket = _BUCKET
    dispatch = (
        f'[.records[] | select(.type=="dispatch") | {{key: .backend.{{field}}, bucket: {bucket}}}]'
    )
    requests = (
        '[.records[] | select(.type!="completion")] | group_by(.request_id) | '
        f"map(min_by(.index)) | map({{key: .tenant, bucket: {bucket}}})"
    )
    fallback = (
        '[.records[] | select(.type=="dispatch" and .fallback!=null) | '
        f"{{key: .fallback, bucket: {bucket}}}]"
    )
    refusal = f'[.records[] | select(.type=="refusal") | {{key: .rule, bucket: {bucket}}}]'
    found: dict[str, Any] = {
        "dispatches_by_backend": _series(
            "Dispatches per backend",
            "dispatch records (one per attempt) per backend id",
            [(r.data["backend"]["id"], m) for r, m in dispatches],
            width,
            dispatch.replace("{field}", "id"),
            run,
        ),
        "dispatches_by_region": _series(
            "Dispatches per region",
            "dispatch records per region of the backend they went to",
            [(r.data["backend"]["region"], m) for r, m in dispatches],
            width,
            dispatch.replace("{field}", "region"),
            run,
        ),
        "requests_by_tenant": _series(
            "Requests per tenant",
            "request ids with a dispatch or refusal record, at their first such record",
            list(first_of.values()),
            width,
            requests,
            run,
        ),
        "fallbacks_by_reason": _series(
            "Hosted fallbacks per reason",
            "dispatch records with a fallback reason; rate = fallbacks / dispatches",
            fallbacks,
            width,
            fallback,
            run,
        ),
        "refusals_by_rule": _series(
            "Refusals per rule",
            "refusal records per refusing rule; rate = refusals / requests",
            refusals,
            width,
            refusal,
            run,
        ),
    }
    _add_rates(found, len(dispatches), len(first_of), run)
    found["checkpoints"] = _checkpoints(records, checkpoint_sizes, run)
    found["cosignatures"] = _cosignatures(cosignatures, run)
    totals = {
        "entries": len(records),
        "dispatches": len(dispatches),
        "completions": len(records) - len(dispatches) - len(refusals),
        "refusals": len(refusals),
        "requests": len(first_of),
        "fallbacks": len(fallbacks),
        "bucket_seconds": width,
        "first_time": records[0][1].time if records else None,
        "last_time": records[-1][1].time if records else None,
    }
    return totals, found


def _add_rates(found: dict[str, Any], dispatches: int, requests: int, run: Invocation) -> None:
    fallbacks, refusals = found["fallbacks_by_reason"], found["refusals_by_rule"]
    fallbacks["rates"] = _rates(fallbacks["totals"], dispatches)
    refusals["rates"] = _rates(refusals["totals"], requests)
    rate = "map({key: .[0].key, count: length, rate: (length / $n)})"
    fallbacks["commands"].append(
        run.jq(
            '([.records[] | select(.type=="dispatch")] | length) as $n | [.records[] | '
            'select(.type=="dispatch" and .fallback!=null) | {key: .fallback}] | '
            f"group_by(.key) | {rate}"
        )
    )
    refusals["commands"].append(
        run.jq(
            '([.records[] | select(.type!="completion") | .request_id] | unique | length) as $n'
            ' | [.records[] | select(.type=="refusal") | {key: .rule}] | '
            f"group_by(.key) | {rate}"
        )
    )


def _checkpoints(
    records: Sequence[tuple[int, Record]], sizes: Sequence[int], run: Invocation
) -> dict[str, Any]:
    points = [{"size": size, "time": records[size - 1][1].time if size else None} for size in sizes]
    history = shlex.quote(f"{run.logdir}/checkpoints") + "/*"
    program = (
        "(.records | map({key: (.index|tostring), value: .time}) | from_entries) as $t | "
        "[$sizes[] | {size: ., time: $t[(. - 1)|tostring]}]"
    )
    sizes_cmd = f'"$(sed -s -n 2p {history} | jq -s -c .)"'
    show = _SHOW.format(logdir=shlex.quote(run.logdir))
    return {
        "title": "Checkpoints: log size over time",
        "description": "every signed checkpoint in checkpoints/, at the time of the newest "
        "entry it covers",
        "points": points,
        "commands": [
            run.verify("--json"),
            f"{show} | jq -c --argjson sizes {sizes_cmd} {shlex.quote(program)}",
        ],
    }


def _cosignatures(found: Sequence[tuple[int, str, int]], run: Invocation) -> dict[str, Any]:
    points = [
        {"size": size, "witness": witness, "time": _iso(stamp)}
        for size, witness, stamp in sorted(found)
    ]
    newest: dict[str, int] = {}
    for size, witness, _ in found:
        newest[witness] = max(size, newest.get(witness, 0))
    return {
        "title": "Witness cosignatures",
        "description": "checkpoints in cosigned/ with a valid cosignature by a given "
        "witness key, at the witness's timestamp",
        "points": points,
        "newest_by": dict(sorted(newest.items())),
        "commands": [
            run.verify("--json") + " | jq .witnesses",
            run.report(".figures.cosignatures.points"),
        ],
    }


def _verified_cosignatures(
    log: LogDirectory, witnesses: Sequence[CosignatureVerifier], now: float
) -> list[tuple[int, str, int]]:
    """(size, witness, timestamp) of every cosignature `verify_log` accepted."""
    found: list[tuple[int, str, int]] = []
    for size, path in list_cosigned(log.path):
        data = path.read_bytes()
        for witness in witnesses:
            cosignature = find_cosignature(data, witness, now=now)
            if cosignature is not None:
                found.append((size, str(witness), cosignature.timestamp))
    return found


def _read_verified(log: LogDirectory, summary: LogSummary) -> list[tuple[int, Record]]:
    """The entries `verify_log` checked, read again: they must still hash to its root."""
    tree = CompactRange()
    records: list[tuple[int, Record]] = []
    for index, entry in log.entries(summary.size):
        tree.append(leaf_hash(entry))
        records.append((index, parse_record(entry)))
    if tree.root() != summary.root:
        raise LogVerificationError(
            "the log changed while the report read it: its entries no longer hash to the "
            "verified root (run the report on a copy that nothing writes to)"
        )
    return records


def _summary(summary: LogSummary) -> dict[str, Any]:
    """The verification result, as `owngate audit verify --json` prints it."""
    result: dict[str, Any] = {
        "origin": summary.origin,
        "size": summary.size,
        "root": summary.root.hex(),
        "checkpoints": summary.checkpoints,
        "signed_by": list(summary.signed_by),
        "earlier_checkpoints": summary.earlier_checkpoints,
        "unsigned_entries": summary.unsigned_entries,
        "open_dispatches": summary.open_dispatches,
    }
    witnessed = summary.witnesses
    if witnessed is not None:
        result["witnesses"] = {
            "cosigned_checkpoints": witnessed.cosigned,
            "witnessed_size": witnessed.witnessed_size,
            "min_witnesses": witnessed.min_witnesses,
            "newest_by": witnessed.newest_by,
        }
    return result


def audit_report(
    directory: str | Path,
    verifiers: Sequence[Verifier],
    run: Invocation,
    *,
    origin: str | None = None,
    trusted_checkpoints: Iterable[bytes] = (),
    witnesses: Sequence[CosignatureVerifier] = (),
    min_witnesses: int = 1,
    accept_earlier_keys: bool = False,
    now: float,
) -> dict[str, Any]:
    """The report of a log directory: `verify_log` (same arguments), then its figures.

    `now` (POSIX seconds) is the verifier's clock (cosignatures from the future are
    refused) and the report's date. Never raises for a log that fails verification: the
    report then has `verification.ok` false, the reason and no totals or figures.
    """
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "generated_at": _iso(int(now)),
        "log": str(directory),
        "verification": {
            "ok": False,
            "error": None,
            "index": None,
            "command": run.verify(),
            "summary": None,
        },
        "totals": None,
        "figures": {},
    }
    verification = report["verification"]
    try:
        summary = verify_log(
            directory,
            verifiers,
            origin=origin,
            trusted_checkpoints=trusted_checkpoints,
            witnesses=witnesses,
            min_witnesses=min_witnesses,
            now=now,
            accept_earlier_keys=accept_earlier_keys,
        )
        log = LogDirectory(directory)
        records = _read_verified(log, summary)
        cosigned = _verified_cosignatures(log, witnesses, now) if witnesses else []
    except LogVerificationError as exc:
        verification["error"], verification["index"] = str(exc), exc.index
        return report
    except (MalformedError, SignatureError) as exc:  # a file changed after verify_log
        verification["error"] = f"the log changed while the report read it: {exc}"
        return report
    verification["ok"] = True
    verification["summary"] = _summary(summary)
    sizes = [size for size, _ in log.history()]
    report["totals"], report["figures"] = figures(records, sizes, cosigned, run)
    return report
