"""`owngate bench attest`'s figures and report (bench/owngate_bench/attest.py runs the
targets): per target the medians of its repetitions, the p50 the sidecar adds, taken
within each repetition, and the verdicts against the issue's targets, each n/a with why
when a repetition of what it reads failed or answered with errors."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from owngate_bench.verdict_figures import passes, shown

__all__ = ["ADDED_P50_MS", "SIDECAR_CPU_US", "figures", "render"]

ADDED_P50_MS = 0.3
SIDECAR_CPU_US = 100.0


def _row(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """One repetition of one target: requests, p50/p99 (ms), sidecar CPU µs per request."""
    if "error" in result or not result.get("requests"):
        return None
    requests = result["requests"]
    sidecar_cpu = result["cpu_s"].get("sidecar")
    return {
        "requests": requests,
        "errors": result["errors"],
        "p50_ms": result["latency_ms"]["p50"],
        "p99_ms": result["latency_ms"]["p99"],
        "sidecar_cpu_us_per_req": None if sidecar_cpu is None else 1e6 * sidecar_cpu / requests,
    }


def figures(results: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per target over the repetitions (one result per target, or a list of them): requests
    and errors summed, medians of p50, p99 and sidecar CPU per request (None when a
    repetition failed); and the p50 the sidecar adds, the median of each repetition's own
    difference (None when a repetition of either side failed or had errors)."""
    reps = [results] if isinstance(results, Mapping) else list(results)
    per_rep = [{target: _row(result) for target, result in rep.items()} for rep in reps]
    rows: dict[str, Any] = {}
    for target in per_rep[0] if per_rep else ():
        got = [rep.get(target) for rep in per_rep]
        if any(row is None for row in got):
            rows[target] = None
            continue
        found = [row for row in got if row is not None]
        cpu = [row["sidecar_cpu_us_per_req"] for row in found]
        rows[target] = {
            "requests": sum(row["requests"] for row in found),
            "errors": sum(row["errors"] for row in found),
            "p50_ms": statistics.median(row["p50_ms"] for row in found),
            "p99_ms": statistics.median(row["p99_ms"] for row in found),
            "sidecar_cpu_us_per_req": None if None in cpu else statistics.median(cpu),
            "reps": len(found),
        }

    def added(over: str, base: str) -> float | None:
        diffs = []
        for rep in per_rep:
            a, b = _clean(rep.get(over)), _clean(rep.get(base))
            if a is None or b is None:
                return None
            diffs.append(a["p50_ms"] - b["p50_ms"])
        return statistics.median(diffs) if diffs else None

    return {
        "reps": len(reps),
        "targets": rows,
        "added_p50_ms": {
            "sidecar": added("sidecar", "direct"),
            "gateway+sidecar": added("gateway+sidecar", "gateway"),
        },
    }


def _clean(row: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A target's row when it is a figure: it ran and answered without errors (a failed
    answer is cheap and fast, so a verdict on it would flatter the sidecar)."""
    return None if row is None or row.get("errors") else row


def render(report: Mapping[str, Any]) -> str:
    reps = int(report.get("reps", 1))
    lines = [
        f"owngate bench attest: concurrency {report['concurrency']}, "
        f"{'streams' if report['stream'] else 'whole answers'}, {report['backend_name']}; "
        f"medians of {reps} interleaved repetition{'s' * (reps != 1)}; "
        f"the machine was {report['machine_busy']:.0%} busy (shared machines move these)",
        f"  {'target':<17} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'sidecar CPU/req':>16}",
    ]
    for target, row in report["targets"].items():
        if row is None:
            lines.append(f"  {target:<17} failed")
            continue
        cpu = row["sidecar_cpu_us_per_req"]
        lines.append(
            f"  {target:<17} {row['requests']:>8} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
            f"{'-' if cpu is None else f'{cpu:,.0f} µs':>16}"
        )
    for name, value in report["added_p50_ms"].items():
        figure = "-" if value is None else f"{shown(value, 3, '<=', ADDED_P50_MS, '+,')} ms"
        why = "" if value is not None else _why(report, (name, _BASES[name]))
        lines.append(
            f"  {_verdict(value, ADDED_P50_MS)} p50 added by the sidecar ({name}): {figure} "
            f"(target <= {ADDED_P50_MS} ms){why}"
        )
    for name in ("sidecar", "gateway+sidecar"):
        row = _clean(report["targets"].get(name))
        cpu = None if row is None else row["sidecar_cpu_us_per_req"]
        figure = "-" if cpu is None else f"{shown(cpu, 0, '<=', SIDECAR_CPU_US)} µs"
        why = "" if cpu is not None else _why(report, (name,))
        lines.append(
            f"  {_verdict(cpu, SIDECAR_CPU_US)} sidecar CPU per request ({name}): {figure} "
            f"(target <= {SIDECAR_CPU_US:.0f} µs){why}"
        )
    audit = report["audit"]
    lines.append("  audit: ok" if audit is None else f"  audit FAILED: {audit}")
    return "\n".join(lines)


_BASES = {"sidecar": "direct", "gateway+sidecar": "gateway"}  # what each added p50 is over


def _why(report: Mapping[str, Any], names: Sequence[str]) -> str:
    """Why a verdict reading `names` is n/a, for its line: which of them failed in a
    repetition or answered requests with errors (no figure taken on a failed answer)."""
    found = []
    for name in names:
        row = report["targets"].get(name)
        if row is None:
            found.append(f"{name} failed in a repetition")
        elif row.get("errors"):
            found.append(f"{name} answered {row['errors']:,} request(s) with errors")
    return f": not measured, {'; '.join(found) or 'no figure'}"


def _verdict(value: float | None, target: float) -> str:
    """`met`, `NOT MET` or `n/a` (not measured), padded to one width."""
    if value is None:
        return "n/a    "
    return "met    " if passes(value, "<=", target) else "NOT MET"
