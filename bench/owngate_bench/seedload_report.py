"""What `owngate bench seed-load` prints: per-target medians, the verdicts, the warnings.

Per run (one target, one repetition) from the client's result (`owngate_bench.seedclient`):
cores of the target's process tree over the measured window, its CPU per request and
per relayed chunk, TTFT p50/p99, ITL p99, and TTFT p99 added: the target's p99 less
`direct`'s from the same repetition. Per target: the median of its runs. The verdicts
read the production configuration's medians; with `--scale` below 1 its cores at the
full load are projected linearly (cores / scale) and the verdict says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from owngate_bench.verdict_figures import passes, shown

__all__ = ["MAX_ADDED_TTFT_P99_MS", "MAX_PRODUCTION_CORES", "render", "summarise"]

MAX_PRODUCTION_CORES = 0.5
MAX_ADDED_TTFT_P99_MS = 2.0
_CLIENT_CORES_LIMIT = 0.85  # one Python process near a whole core falls behind its schedule
_SEND_LAG_P99_LIMIT_MS = 10.0
_DRIVEN_SHARE = 0.9  # of the chunks/s the arrivals ask for, as `direct` received them
_KEPT_UP = 0.95  # of direct's chunks/s: below it, a target's streams queued behind the load
_COALESCED_MORE = 0.10  # of its chunks arriving several to a read, beyond direct's share


def _run_figures(result: Mapping[str, Any], direct: Mapping[str, Any] | None) -> dict[str, float]:
    elapsed = float(result["elapsed_s"])
    cpu = float(result["cpu_s"]["target"])
    requests, chunks = int(result["requests"]), int(result["chunks"])
    sims = sum(float(v) for k, v in result["cpu_s"].items() if k.startswith("sim"))
    figures = {
        "cores": cpu / elapsed,
        "cpu_ms_per_request": 1000 * cpu / requests if requests else math.nan,
        "cpu_us_per_chunk": 1e6 * cpu / chunks if chunks else math.nan,
        "chunks_per_s": float(result["chunks_per_s"]),
        "ttft_p50_ms": float(result["ttft_ms"].get("p50", math.nan)),
        "ttft_p99_ms": float(result["ttft_ms"].get("p99", math.nan)),
        "itl_p99_ms": float(result["itl_ms"].get("p99", math.nan)),
        "client_cores": float(result["cpu_s"]["client"]) / elapsed,
        "sim_cores": sims / elapsed,
        "machine_cores": float(result["cpu_s"]["machine"]) / elapsed,
        "send_lag_p99_ms": float(result["send_lag_ms"].get("p99", math.nan)),
        "errors": float(result["errors"]),
    }
    for name, value in result.get("dispatch_wait_ms", {}).items():
        figures[f"dispatch_wait_{name}_ms"] = float(value)
    if "coalesced_share" in result:
        figures["coalesced_share"] = float(result["coalesced_share"])
    # direct is the yardstick only when every stream it served succeeded: one that shed
    # streams has a lower chunk rate and its survivors' TTFT, and would flatter the rest
    if direct is not None and "error" not in direct and not direct.get("errors"):
        figures["ttft_p99_added_ms"] = figures["ttft_p99_ms"] - float(
            direct["ttft_ms"].get("p99", math.nan)
        )
        direct_rate = float(direct["chunks_per_s"])
        figures["chunks_vs_direct"] = figures["chunks_per_s"] / direct_rate if direct_rate else 0.0
        if "coalesced_share" in direct:
            figures["direct_coalesced_share"] = float(direct["coalesced_share"])
    return figures


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def summarise(
    reps: Sequence[Mapping[str, Mapping[str, Any]]],
    targets: Sequence[str],
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """Per target: every run's figures and their medians; the verdicts; the warnings."""
    per_target: dict[str, Any] = {}
    for name in targets:
        runs = [
            _run_figures(rep[name], rep.get("direct"))
            for rep in reps
            if name in rep and "error" not in rep[name]
        ]
        failed = [rep[name]["error"] for rep in reps if name in rep and "error" in rep[name]]
        keys = sorted({key for run in runs for key in run})
        medians = {key: _median([run[key] for run in runs if key in run]) for key in keys}
        if name == "direct":
            medians.pop("ttft_p99_added_ms", None)
        per_target[name] = {"runs": runs, "failed": failed, "median": medians}
    return {
        "targets": per_target,
        "verdicts": _verdicts(per_target, float(settings["scale"])),
        "warnings": _warnings(per_target, settings),
    }


def _failed(production: Mapping[str, Any]) -> str | None:
    """Why the production runs are no figure: none ran, one failed, or streams failed
    (a stream answered 503 costs the gateway nothing: fewer cores, not a leaner relay)."""
    if not production.get("runs"):
        return "owngate+production did not run"
    if production.get("failed"):
        return f"owngate+production failed in {len(production['failed'])} run(s)"
    errors = sum(run["errors"] for run in production["runs"])
    if errors:
        return f"owngate+production answered {errors:,.0f} streams with errors"
    return None


def _behind(production: Mapping[str, Any]) -> str | None:
    """Why a run did not carry the seed load, or cannot be shown to have: its client
    received under `_KEPT_UP` of the chunks/s direct received in the same repetition (the
    streams queued), direct failed or served errors in that repetition (no yardstick), or
    over `_COALESCED_MORE` more of its chunks came several to a read than direct's (the
    relay wrote several paced tokens at once: cheaper chunks than the load's one-token
    writes)."""
    for run in production.get("runs", []):
        if "chunks_vs_direct" not in run:  # no clean direct run beside it: nothing says
            return "no clean direct run in the same repetition to compare its chunks/s with"
        share = run["chunks_vs_direct"]
        if share < _KEPT_UP:
            return f"received {share:.0%} of direct's chunks/s in the same repetition"
        mine, base = run.get("coalesced_share", 0.0), run.get("direct_coalesced_share", 0.0)
        if mine > base + _COALESCED_MORE:
            return f"{mine:.0%} of its chunks came several to a read (direct {base:.0%})"
    return None


def _undriven(per_target: Mapping[str, Any]) -> str | None:
    """Why the arrivals did not go out as scheduled in some run, if they did not: the load
    generator used over `_CLIENT_CORES_LIMIT` of a core (it could not drive the load), or
    its sends went out over `_SEND_LAG_P99_LIMIT_MS` late at p99. The target then carried
    a lighter, burstier load than the seed load, however it kept up with direct."""
    for name, target in per_target.items():
        for run in target.get("runs", []):
            if run["client_cores"] > _CLIENT_CORES_LIMIT:
                return (
                    f"the load was not driven: the load generator used {run['client_cores']:.2f} "
                    f"core in a run of {name}"
                )
            if run["send_lag_p99_ms"] > _SEND_LAG_P99_LIMIT_MS:
                return (
                    f"the load was not driven: arrivals went out {run['send_lag_p99_ms']:.1f} ms "
                    f"late (p99) in a run of {name}"
                )
    return None


def _verdicts(per_target: Mapping[str, Any], scale: float) -> list[dict[str, Any]]:
    """Production's cores and added TTFT p99: not measured when its runs failed or had
    errors; cores within the target are not measured either when it fell behind the load,
    or the arrivals were not sent as scheduled (cores over the target are a miss all the same:
    carrying the full load would take more)."""
    target = per_target.get("owngate+production", {})
    production = target.get("median", {})
    cores = production.get("cores", math.nan) / scale
    added = production.get("ttft_p99_added_ms", math.nan)
    how = "measured" if scale == 1.0 else f"projected from {scale:g} of the load (cores / scale)"
    failed = _failed(target)
    behind = None if failed else _behind(target)
    if behind:
        behind = f"fell behind the load: {behind}"
    elif not failed:
        behind = _undriven(per_target)
    unpaired = sum(1 for run in target.get("runs", []) if "ttft_p99_added_ms" not in run)
    baseless = (  # the median of the repetitions with a clean direct is not the run's
        f"no clean direct run beside it in {unpaired} repetition(s)" if unpaired else None
    )
    cores_met = None if failed else _met(cores, MAX_PRODUCTION_CORES)
    if cores_met and behind:
        cores_met = None
    return [
        {
            "id": "production_cores",
            "what": "owngate+production cores at the seed load (one worker)",
            "value": cores,
            "target": MAX_PRODUCTION_CORES,
            "how": how,
            "met": cores_met,
            "why_not_measured": failed or behind,
        },
        {
            "id": "production_ttft_p99_added",
            "what": "owngate+production TTFT p99 added vs direct, ms",
            "value": added,
            "target": MAX_ADDED_TTFT_P99_MS,
            "how": "measured" if scale == 1.0 else f"measured at {scale:g} of the load",
            "met": None if failed or baseless else _met(added, MAX_ADDED_TTFT_P99_MS),
            "why_not_measured": failed or baseless,
        },
    ]


def _met(value: float, target: float) -> bool | None:
    return None if not math.isfinite(value) else passes(value, "<=", target)


def _warnings(per_target: Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    everyone = [run for target in per_target.values() for run in target["runs"]]
    client = max((run["client_cores"] for run in everyone), default=math.nan)
    lag = max((run["send_lag_p99_ms"] for run in everyone), default=math.nan)
    asked = float(settings["chunks_per_s"])
    direct_runs = per_target.get("direct", {}).get("runs", [])
    driven = min((run["chunks_per_s"] for run in direct_runs), default=math.nan)
    if client > _CLIENT_CORES_LIMIT:
        found.append(
            f"the load generator could not drive this load here: it used up to {client:.2f} "
            "core (one Python process); rerun with a smaller --scale (per-request and "
            "per-chunk figures hold; cores scale with it)"
        )
    elif lag > _SEND_LAG_P99_LIMIT_MS or driven < _DRIVEN_SHARE * asked:
        found.append(
            f"arrivals went out up to {lag:.1f} ms late (p99) and direct received "
            f"{driven:,.0f} of the {asked:,.0f} chunks/s asked, while the load generator "
            f"used at most {client:.2f} core: the machine, not the client, was short of CPU"
        )
    busy = max((run["machine_cores"] for run in everyone), default=math.nan)
    cpus = int(settings["cpu_count"] or 1)
    if busy > 0.9 * cpus:
        found.append(
            f"the machine was saturated ({busy:.2f} of {cpus} cores busy at the worst run): "
            "latency figures include waiting for a core"
        )
    return found


def _verdict_figure(value: float, target: float) -> str:
    return shown(value, 3, "<=", target) if math.isfinite(value) else "-"


def _cell(value: float | None, digits: int, width: int) -> str:
    if value is None or not math.isfinite(value):
        return f"{'-':>{width}}"
    return f"{value:>{width},.{digits}f}"


_COLUMNS = (
    ("cores", "cores", 2, 7),
    ("CPU/req ms", "cpu_ms_per_request", 2, 11),
    ("CPU/chunk us", "cpu_us_per_chunk", 1, 13),
    ("chunks/s", "chunks_per_s", 0, 9),
    ("TTFT p50", "ttft_p50_ms", 1, 9),
    ("TTFT p99", "ttft_p99_ms", 1, 9),
    ("ITL p99", "itl_p99_ms", 1, 8),
    ("p99 added", "ttft_p99_added_ms", 1, 10),
    ("errors", "errors", 0, 7),
)


def render(report: Mapping[str, Any]) -> str:
    s = report["settings"]
    summary = report["summary"]
    lines = [
        f"seed load: {s['full_rate']:g} streams/s x {s['tokens']} tokens, one write per token "
        f"{1000 * s['token_interval_s']:g} ms apart ({s['full_rate'] * s['tokens']:,.0f} "
        f"chunks/s); --scale {s['scale']:g}: {s['rate']:g} streams/s, "
        f"{s['chunks_per_s']:,.0f} chunks/s, ~{s['open_streams']:,.0f} open streams",
        f"{s['duration_s']:g} s of arrivals per run (measured from {s['warmup_s']:g} s), "
        f"{s['reps']} interleaved repetitions, medians; "
        f"{report['machine']['cpu_count']} CPUs, load average at start "
        f"{report['machine']['loadavg_at_start'][0]:.2f}",
        "",
        f"{'target':<20}" + "".join(f"{title:>{width}}" for title, _, _, width in _COLUMNS),
    ]
    for name, target in summary["targets"].items():
        if not target["runs"]:
            why = report["targets"].get(name, {}).get("skipped") or "; ".join(target["failed"])
            lines.append(f"{name:<20}  skipped: {str(why)[:200]}")
            continue
        median = target["median"]
        label = "direct (simulator)" if name == "direct" else name
        cells = "".join(_cell(median.get(key), d, w) for _, key, d, w in _COLUMNS)
        lines.append(f"{label:<20}{cells}")
    runs = [run for t in summary["targets"].values() for run in t["runs"]]
    if runs:
        lines += [
            "",
            "times in ms; cores: CPU seconds of the target's process tree per second of the "
            "measured window (direct: the simulator itself)",
            f"load generator {_median([r['client_cores'] for r in runs]):.2f} core, "
            f"simulator(s) {_median([r['sim_cores'] for r in runs]):.2f} core, whole machine "
            f"{_median([r['machine_cores'] for r in runs]):.2f} cores busy (medians over runs)",
        ]
    production = summary["targets"].get("owngate+production", {}).get("median", {})
    if "dispatch_wait_p50_ms" in production:
        lines.append(
            "owngate+production waits for its dispatch record to be durable (group commit, "
            f"fsync) before the upstream send: p50 {production['dispatch_wait_p50_ms']:.1f} ms, "
            f"p99 {production.get('dispatch_wait_p99_ms', math.nan):.1f} ms of its TTFT"
        )
    lines += ["", "verdicts:"]
    for verdict in summary["verdicts"]:
        word = {True: "met", False: "not met", None: "not measured"}[verdict["met"]]
        why = verdict.get("why_not_measured") if verdict["met"] is None else None
        lines.append(
            f"  {verdict['what']} <= {verdict['target']:g}: {word} "
            f"({_verdict_figure(verdict['value'], verdict['target'])}, {verdict['how']}"
            + (f"; {why})" if why else ")")
        )
    for warning in summary["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
