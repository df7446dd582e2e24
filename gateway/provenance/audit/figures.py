"""The figures of `owngate audit report`: a verified log's entries folded into counts.

Each figure carries the commands that reproduce its numbers without this module: `jq`
over `owngate audit show LOGDIR --records --json` (which lists every record with its
index). So the definitions here are kept to what a short `jq` filter can say:

* time buckets are `bucket_seconds` wide (chosen from the first and the last entry's
  time, widened to a multiple of it when a record lies outside them: a clock that
  stepped) and aligned to the Unix epoch; a record's time is truncated to the second (`jq`:
  `.time[:19]+"Z" | fromdateiso8601`);
* a dispatch is one attempt at one backend (a retried request has several);
* a request is one request id with a dispatch or refusal record, counted at its first
  such record (the tenant and time of that record);
* a fallback is a dispatch whose `fallback` is not null; its rate is over dispatches;
* a refusal's rule is its `rule`; its rate is over requests;
* a dispatch's data class is its `data_class`, `(none)` when null (no class applied) and
  `(not recorded)` in records written before it existed;
* a checkpoint's time is the time of the newest entry it covers (checkpoints carry no
  time; it was signed at or after it); a cosignature's time is the witness's timestamp.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.provenance.audit.remote import is_url
from gateway.provenance.formats.records import Record

__all__ = [
    "BUCKET_SECONDS",
    "MAX_BUCKETS",
    "Cosignatures",
    "Invocation",
    "bucket_seconds",
    "data_class_key",
    "figures",
    "iso_time",
    "record_seconds",
]

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


@dataclass(frozen=True, slots=True)
class Cosignatures:
    """What `cosigned/` holds: its file count, whether witness keys were given (checked),
    and each valid cosignature by one of them as (size, witness, POSIX timestamp)."""

    files: int
    checked: bool
    found: tuple[tuple[int, str, int], ...] = ()


def data_class_key(data: dict[str, Any]) -> str:
    """A dispatch or refusal record's data class as a figure's key: the class name,
    `(none)` for null, `(not recorded)` when the record predates the field (a class name
    has no parentheses, so neither is ever a class)."""
    if "data_class" not in data:
        return "(not recorded)"
    name = data["data_class"]
    return "(none)" if name is None else str(name)


def record_seconds(time: str) -> int:
    """A record time (`2026-01-31T12:00:00.250Z`) as POSIX seconds, truncated."""
    return int(datetime.fromisoformat(time[:19] + "+00:00").timestamp())


def iso_time(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bucket_seconds(first: int, last: int, of: int = 1) -> int:
    """The smallest width (a multiple of `of`) that covers `first..last` (POSIX seconds)
    in MAX_BUCKETS; a week beyond that."""
    for width in BUCKET_SECONDS:
        if width % of == 0 and last // width - first // width < MAX_BUCKETS:
            return width
    return BUCKET_SECONDS[-1]


def _widened(tally: dict[str, Counter[tuple[str, int]]], width: int) -> int:
    """Widen the buckets when records lie outside the first and the last entry's time
    (a clock stepped back or forward between them; each one a record it could not
    order): at the width chosen from those two, one record dated 10 years on made a
    chart of 300 million empty one-second buckets (`report_html`: gigabytes). The new
    width is a multiple of the old, so each old bucket falls whole into one new one and
    the counts stay exact (the `jq` commands print the new width)."""
    starts = [bucket for counts in tally.values() for _, bucket in counts]
    if not starts or max(starts) // width - min(starts) // width < MAX_BUCKETS:
        return width
    wider = bucket_seconds(min(starts), max(starts), width)
    for name, counts in tally.items():
        merged: Counter[tuple[str, int]] = Counter()
        for (key, bucket), count in counts.items():
            merged[key, bucket - bucket % wider] += count
        tally[name] = merged
    return wider


_SERIES = (
    "dispatches_by_backend",
    "dispatches_by_region",
    "dispatches_by_data_class",
    "requests_by_tenant",
    "fallbacks_by_reason",
    "refusals_by_rule",
)
_DISPATCH = '[.records[] | select(.type=="dispatch") | {key: .backend.FIELD, bucket: BUCKET}]'
# name -> (title, description, the jq selector of its {key, bucket} pairs)
_DEFINITIONS: dict[str, tuple[str, str, str]] = {
    "dispatches_by_backend": (
        "Dispatches per backend",
        "dispatch records (one per attempt) per backend id",
        _DISPATCH.replace("FIELD", "id"),
    ),
    "dispatches_by_region": (
        "Dispatches per region",
        "dispatch records per region of the backend they went to",
        _DISPATCH.replace("FIELD", "region"),
    ),
    "dispatches_by_data_class": (
        "Dispatches per data class",
        "dispatch records per data class the policy decision applied (`(none)`: none; "
        "`(not recorded)`: a record written before records named it)",
        '[.records[] | select(.type=="dispatch") | {key: (if has("data_class") then '
        '(.data_class // "(none)") else "(not recorded)" end), bucket: BUCKET}]',
    ),
    "requests_by_tenant": (
        "Requests per tenant",
        "request ids with a dispatch or refusal record, at their first such record",
        '[.records[] | select(.type=="dispatch" or .type=="refusal")] | group_by(.request_id) | '
        "map(min_by(.index)) | map({key: .tenant, bucket: BUCKET})",
    ),
    "fallbacks_by_reason": (
        "Hosted fallbacks per reason",
        "dispatch records with a fallback reason; rate = fallbacks / dispatches",
        '[.records[] | select(.type=="dispatch" and .fallback!=null) | '
        "{key: .fallback, bucket: BUCKET}]",
    ),
    "refusals_by_rule": (
        "Refusals per rule",
        "refusal records per refusing rule; rate = refusals / requests",
        '[.records[] | select(.type=="refusal") | {key: .rule, bucket: BUCKET}]',
    ),
}


class _Fold:
    """One pass over the records in log order; memory: the tallies and the request ids."""

    def __init__(self, width: int, times_of: Iterable[int]) -> None:
        self.width = width
        self.tally: dict[str, Counter[tuple[str, int]]] = {name: Counter() for name in _SERIES}
        self.requests: set[str] = set()
        self.entries = self.dispatches = self.completions = self.refusals = self.fallbacks = 0
        self.first_time: str | None = None
        self.last_time: str | None = None
        self.wanted = set(times_of)
        self.times: dict[int, str] = {}  # entry index -> its time, for the wanted indexes

    def add(self, index: int, record: Record) -> None:
        self.entries += 1
        if self.first_time is None:
            self.first_time = record.time
        self.last_time = record.time
        if index in self.wanted:
            self.times[index] = record.time
        if record.type == "completion":
            self.completions += 1
        if record.type not in ("dispatch", "refusal"):  # a completion, an admin action
            return
        moment = record_seconds(record.time)
        bucket = moment - moment % self.width
        data, tally = record.data, self.tally
        if record.request_id not in self.requests:
            self.requests.add(record.request_id)
            tally["requests_by_tenant"][data["tenant"], bucket] += 1
        if record.type == "refusal":
            self.refusals += 1
            tally["refusals_by_rule"][data["rule"], bucket] += 1
            return
        self.dispatches += 1
        tally["dispatches_by_backend"][data["backend"]["id"], bucket] += 1
        tally["dispatches_by_region"][data["backend"]["region"], bucket] += 1
        tally["dispatches_by_data_class"][data_class_key(data), bucket] += 1
        if data["fallback"] is not None:
            self.fallbacks += 1
            tally["fallbacks_by_reason"][data["fallback"], bucket] += 1


def _series(
    name: str, tally: Counter[tuple[str, int]], width: int, run: Invocation
) -> dict[str, Any]:
    title, what, selector = _DEFINITIONS[name]
    rows = sorted(tally.items())  # by key, then bucket: as jq's group_by([.key,.bucket])
    totals: Counter[str] = Counter()
    for (key, _), count in rows:
        totals[key] += count
    program = f"{selector.replace('BUCKET', _BUCKET.format(width=width))} | {_COUNTS}"
    return {
        "title": title,
        "description": what,
        "totals": dict(sorted(totals.items(), key=lambda item: (-item[1], item[0]))),
        "counts": [{"key": k, "bucket": iso_time(b), "count": n} for (k, b), n in rows],
        "commands": [run.jq(program)],
    }


def _rates(counts: dict[str, int], total: int) -> list[dict[str, Any]]:
    return [
        {"key": key, "count": count, "rate": count / total if total else 0.0}
        for key, count in sorted(counts.items())
    ]


def figures(
    records: Iterable[tuple[int, Record]],
    width: int,
    checkpoint_sizes: Sequence[int],
    cosignatures: Cosignatures,
    run: Invocation,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(totals, figures) of verified records in log order, counted in buckets of `width`
    seconds, with the history's checkpoint sizes and the cosignatures. Reads `records`
    once."""
    fold = _Fold(width, (size - 1 for size in checkpoint_sizes if size))
    for index, record in records:
        fold.add(index, record)
    width = _widened(fold.tally, width)
    found: dict[str, Any] = {name: _series(name, fold.tally[name], width, run) for name in _SERIES}
    _add_rates(found, fold.dispatches, len(fold.requests), run)
    points = [
        {"size": size, "time": fold.times.get(size - 1) if size else None}
        for size in checkpoint_sizes
    ]
    found["checkpoints"] = _checkpoints(points, run)
    found["cosignatures"] = _cosignatures(cosignatures, run)
    totals = {
        "entries": fold.entries,
        "dispatches": fold.dispatches,
        "completions": fold.completions,
        "refusals": fold.refusals,
        "requests": len(fold.requests),
        "fallbacks": fold.fallbacks,
        "bucket_seconds": width,
        "first_time": fold.first_time,
        "last_time": fold.last_time,
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
            '([.records[] | select(.type=="dispatch" or .type=="refusal") | .request_id] | '
            'unique | length) as $n | [.records[] | select(.type=="refusal") | {key: .rule}] | '
            f"group_by(.key) | {rate}"
        )
    )


def _checkpoints(points: list[dict[str, Any]], run: Invocation) -> dict[str, Any]:
    program = (
        "(.records | map({key: (.index|tostring), value: .time}) | from_entries) as $t | "
        "[$sizes[] | {size: ., time: $t[(. - 1)|tostring]}]"
    )
    if is_url(run.logdir):
        # A replica served as tlog-tiles has no checkpoints/ to read (and a shell glob
        # over a URL reads nothing): its one checkpoint is the one `verify` fetches.
        sizes_cmd = f"\"$({run.verify('--json')} | jq -c '[.size]')\""
        description = "the checkpoint the replica serves (tlog-tiles serves no history)"
    else:
        history = shlex.quote(f"{run.logdir}/checkpoints") + "/*"
        sizes_cmd = f'"$(sed -s -n 2p {history} | jq -s -c .)"'
        description = "every signed checkpoint in checkpoints/"
    show = _SHOW.format(logdir=shlex.quote(run.logdir))
    return {
        "title": "Checkpoints: log size over time",
        "description": f"{description}, at the time of the newest entry it covers",
        "points": points,
        "commands": [
            run.verify("--json"),
            f"{show} | jq -c --argjson sizes {sizes_cmd} {shlex.quote(program)}",
        ],
    }


def _cosignatures(cosigned: Cosignatures, run: Invocation) -> dict[str, Any]:
    points = [
        {"size": size, "witness": witness, "time": iso_time(stamp)}
        for size, witness, stamp in sorted(cosigned.found)
    ]
    newest: dict[str, int] = {}
    for size, witness, _ in cosigned.found:
        newest[witness] = max(size, newest.get(witness, 0))
    return {
        "title": "Witness cosignatures",
        "description": "checkpoints in cosigned/ with a valid cosignature by a given "
        "witness key, at the witness's timestamp",
        "files": cosigned.files,
        "checked": cosigned.checked,
        "points": points,
        "newest_by": dict(sorted(newest.items())),
        "commands": [
            run.verify("--json") + " | jq .witnesses",
            run.report(".figures.cosignatures.points"),
        ],
    }
