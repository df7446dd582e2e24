"""The provenance benchmark's report (`owngate bench provenance`, provenance_overhead.py):
each cell's figures, the on/off ratios of a load point, the verdicts on the issue's
targets (the median over each point's runs) and the side-by-side table, which also
renders a saved JSON report.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from owngate_bench.verdict_figures import passes, shown

__all__ = [
    "MAX_ADDED_TTFT_P50_MS",
    "MIN_THROUGHPUT_RATIO",
    "on_off_ratios",
    "progress_line",
    "render",
    "render_verdicts",
    "verdicts",
]

# The targets: with the log on, at most 15 % fewer requests per second and at
# most 2 ms more time to first token (p50).
MIN_THROUGHPUT_RATIO = 0.85
MAX_ADDED_TTFT_P50_MS = 2.0


def _figures(result: Mapping[str, Any]) -> dict[str, float] | None:
    """req/s, TTFT p50/p99 (ms) and gateway CPU ms per request of one cell."""
    if "error" in result or not result.get("requests"):
        return None
    requests = result["requests"]
    return {
        "req_per_s": result["req_per_s"],
        "ttft_p50_ms": result["ttft_ms"].get("p50", 0.0),
        "ttft_p99_ms": result["ttft_ms"].get("p99", 0.0),
        "cpu_ms_per_req": 1000.0 * result["cpu_s"]["gateway"] / requests,
    }


def on_off_ratios(results: Mapping[str, Any]) -> dict[str, float | None]:
    """A load point's on/off ratio of each figure, and the TTFT p50 the log added (ms);
    none when a side failed or answered with errors (a failed answer is cheap and fast:
    the log "on" shedding requests is no figure of what the log costs)."""
    if any(side.get("errors") for side in (results.get("off", {}), results.get("on", {}))):
        return {}
    off, on = _figures(results.get("off", {})), _figures(results.get("on", {}))
    if off is None or on is None:
        return {}
    found: dict[str, float | None] = {
        key: (on[key] / off[key] if off[key] else None) for key in off
    }
    found["added_ttft_p50_ms"] = on["ttft_p50_ms"] - off["ttft_p50_ms"]
    return found


def progress_line(backend: str, concurrency: int, mode: str, result: Mapping[str, Any]) -> str:
    """One cell's progress line for the run's log."""
    figures = _figures(result)
    if figures is None:
        return f"  {backend:<13} c={concurrency:<3} {mode:<4} failed: {str(result)[:300]}"
    errors = f", {result['errors']} errors" if result["errors"] else ""
    return (
        f"  {backend:<13} c={concurrency:<3} {mode:<4} {figures['req_per_s']:>8,.0f} req/s "
        f"TTFT p50 {figures['ttft_p50_ms']:.2f} ms{errors}"
    )


def _wait(result: Mapping[str, Any]) -> str:
    wait = result.get("dispatch_wait_ms") or {}
    return f"{_cell(wait.get('p50'), 2)} / {_cell(wait.get('p99'), 2)}"


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def verdicts(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (backend, concurrency): the median over its runs of the on/off req/s ratio and
    of the added TTFT p50, each against its target; None unless every run measured it (a
    run that failed or answered with errors has no ratio: the median of the others would
    be the median of the runs that went well, not of the point's runs)."""
    grouped: dict[tuple[str, int], list[Mapping[str, float | None]]] = {}
    for row in points:
        grouped.setdefault((row["backend"], row["concurrency"]), []).append(row["ratios"])
    found: list[dict[str, Any]] = []
    for (backend, concurrency), runs in grouped.items():
        ratios = [float(x) for r in runs if (x := r.get("req_per_s")) is not None]
        added = [float(x) for r in runs if (x := r.get("added_ttft_p50_ms")) is not None]
        ratio = statistics.median(ratios) if ratios and len(ratios) == len(runs) else None
        ttft = statistics.median(added) if added and len(added) == len(runs) else None
        enough = None if ratio is None else passes(ratio, ">=", MIN_THROUGHPUT_RATIO)
        unmeasured = sum(
            1 for r in runs if r.get("req_per_s") is None or r.get("added_ttft_p50_ms") is None
        )
        found.append(
            {
                "backend": backend,
                "concurrency": concurrency,
                "runs": len(runs),
                "throughput_ratio": ratio,
                "throughput_ratios": ratios,
                "throughput_met": enough,
                "added_ttft_p50_ms": ttft,
                "added_ttft_p50_ms_runs": added,
                "ttft_met": None if ttft is None else passes(ttft, "<=", MAX_ADDED_TTFT_P50_MS),
                "why_not_measured": (
                    f"{unmeasured} of {len(runs)} run(s) had no ratio "
                    "(a side failed or answered with errors)"
                    if unmeasured
                    else None
                ),
            }
        )
    return found


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else shown(value, 2, ">=", MIN_THROUGHPUT_RATIO)


def _added(value: float | None) -> str:
    return "-" if value is None else shown(value, 2, "<=", MAX_ADDED_TTFT_P50_MS, "+,")


def _met(met: bool | None) -> str:
    return "no figure" if met is None else "met" if met else "MISSED"


def render_verdicts(found: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        f"targets (median over each point's runs): req/s on/off >= {MIN_THROUGHPUT_RATIO}, "
        f"added TTFT p50 <= {MAX_ADDED_TTFT_P50_MS:g} ms"
    ]
    for v in found:
        runs = ", ".join(f"{x:+.2f}" for x in v["added_ttft_p50_ms_runs"])
        lines.append(
            f"  {v['backend']:<13} c={v['concurrency']:<3} req/s "
            f"{_ratio(v['throughput_ratio'])}x ({_met(v['throughput_met'])}); TTFT p50 "
            f"{_added(v['added_ttft_p50_ms'])} ms ({_met(v['ttft_met'])})"
            + (f" [runs: {runs}]" if v["runs"] > 1 else "")
            + (f"; no figure: {v['why_not_measured']}" if v.get("why_not_measured") else "")
        )
    return lines


def render(report: Mapping[str, Any]) -> str:
    """The side-by-side table of a report (also works on a saved JSON report)."""
    header = (
        "backend       c   req/s off/on      ratio  TTFT p50 off/on ms  TTFT p99 off/on ms"
        "  CPU ms/req off/on  ratio  dispatch wait p50/p99 ms"
    )
    lines = [header, "-" * len(header)]
    repeats = 1 + max((row.get("repeat", 0) for row in report["points"]), default=0)
    for row in report["points"]:
        off, on = _figures(row["results"].get("off", {})), _figures(row["results"].get("on", {}))
        ratios = row["ratios"]

        def pair(key: str, digits: int, off: Any = off, on: Any = on) -> str:
            a = None if off is None else off[key]
            b = None if on is None else on[key]
            return f"{_cell(a, digits)} / {_cell(b, digits)}"

        lines.append(
            f"{row['backend']:<13} {row['concurrency']:<3} {pair('req_per_s', 0):>17} "
            f"{_cell(ratios.get('req_per_s'), 2):>6}  {pair('ttft_p50_ms', 2):>18}  "
            f"{pair('ttft_p99_ms', 2):>18}  {pair('cpu_ms_per_req', 3):>17}  "
            f"{_cell(ratios.get('cpu_ms_per_req'), 2):>5}  {_wait(row['results'].get('on', {}))}"
            + (f"  run {row['repeat'] + 1}" if repeats > 1 else "")
        )
    lines += render_verdicts(verdicts(report["points"]))
    for name, audit in report.get("logs", {}).items():
        lines.append(f"log {name}: {audit}")
    return "\n".join(lines)
