"""`owngate audit show`: requests per backend and region, fallbacks and refusals."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from gateway.cli.audit_flags import (
    env,
    guarded,
    local_log,
    token_flag,
    unverified_size,
)
from gateway.provenance import (
    LogDirectory,
)
from gateway.provenance.audit.shown import shown
from gateway.provenance.audit.summary import Filters, summarise

__all__ = ["add_show"]


def add_show(verbs: Any) -> None:
    show = verbs.add_parser(
        "show",
        help="summarise requests per backend and region, fallbacks and refusals",
        description="Summarise the records of a log (up to its latest checkpoint). This does "
        "not verify the log: run `owngate audit verify` first.",
    )
    show.add_argument("logdir", help="the log directory, or its http(s) URL (as for verify)")
    token_flag(show)
    show.add_argument("--tenant", default=env("TENANT"), help="env OWNGATE_AUDIT_TENANT")
    show.add_argument("--backend", default=env("BACKEND"), help="env OWNGATE_AUDIT_BACKEND")
    show.add_argument(
        "--since", default=env("SINCE"), help="ISO 8601 time, inclusive (env OWNGATE_AUDIT_SINCE)"
    )
    show.add_argument(
        "--until", default=env("UNTIL"), help="ISO 8601 time, exclusive (env OWNGATE_AUDIT_UNTIL)"
    )
    show.add_argument("--records", action="store_true", help="also list the matching records")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=guarded(_show))


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
    with local_log(args.logdir, args) as logdir:
        log = LogDirectory(logdir)
        size = unverified_size(log.latest_note())
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
        names = (shown(r.backend), shown(r.region), shown(r.tier))
        rows.append((*names, *(str(n) for n in counts)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    for title, counter in (
        ("region", summary.regions()),
        ("data class", summary.data_classes),
        ("fallback", summary.fallback_reasons),
        ("refusal", summary.refusal_rules),
    ):
        for reason, count in counter.most_common():
            print(f"{title}: {count} x {shown(reason)}")
    for index, record in summary.records:
        print(f"{index}: {json.dumps(record.data, sort_keys=True)}")
    return 0
