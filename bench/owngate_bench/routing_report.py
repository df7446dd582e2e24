"""Numbers and table of the routing benchmark: per-run summaries, targets, rendering.

`summarize` turns one replay (`owngate_bench.openloop` rows) and the simulators' counters
and load samples into the run's figures. Percentiles are nearest-rank over every request
that was not refused or broken; a request cut off at the end of the run counts with the
time it had waited so far, a lower bound, so a strategy that leaves requests queued is
never flattered by dropping them; an arm with refused or broken requests is no figure for
a target (those are not in its percentiles). `evaluate_targets` checks the issue's targets:

- `hetero_p99_ttft`: on the heterogeneous pool, the scorer's p99 TTFT <= 0.5x round
  robin's;
- `uniform_p99_ttft` and `uniform_p99_e2e`: on the uniform pool, the scorer's p99 TTFT
  (and end-to-end latency) within 5 % of the best of round robin, least in-flight and
  the scorer;
- `prefix_affinity_gain`: on the shared-prefix mix, the scorer with affinity has a p50
  TTFT at least 5 % below the scorer without it;
- `decision_p99`: one `Picker.order` call of the score strategy <= 50 us at p99.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from owngate_bench.loadgen import percentiles

__all__ = ["evaluate_targets", "median_targets", "quantiles", "render", "summarize"]

_OK = ("ok", "unfinished")
DECISION_BUDGET_US = 50.0


def quantiles(values: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """Nearest-rank p50/p95/p99, mean and max, times `scale` (s -> ms by default)."""
    return percentiles(values, scale, (50, 95, 99))


def _queued(loads: Mapping[str, Sequence[tuple[float, int, int]]]) -> dict[str, Any]:
    """Requests waiting in the servers' queues, summed over servers, from the samples."""
    series = list(loads.values())
    count = min((len(s) for s in series), default=0)
    if not count:
        return {}
    totals = [sum(s[i][2] for s in series) for i in range(count)]
    return {
        "mean": sum(totals) / count,
        "max": max(totals),
        "per_backend_mean": {
            name: sum(w for _, _, w in s) / len(s) for name, s in loads.items() if s
        },
        "per_backend_running_mean": {
            name: sum(r for _, r, _ in s) / len(s) for name, s in loads.items() if s
        },
    }


def summarize(
    replayed: Mapping[str, Any],
    counters: Mapping[str, Mapping[str, Any]],
    loads: Mapping[str, Sequence[tuple[float, int, int]]],
) -> dict[str, Any]:
    """The figures of one run (see the module docstring)."""
    rows: list[list[Any]] = replayed["requests"]
    outcomes: dict[str, int] = {}
    for row in rows:
        outcomes[row[3]] = outcomes.get(row[3], 0) + 1
    errors = {k: v for k, v in outcomes.items() if k not in _OK}
    counted = [row for row in rows if row[3] in _OK]
    done = [row for row in rows if row[3] == "ok"]
    span = max((row[5] + row[1] for row in done), default=0.0)
    started = sum(c["started"] for c in counters.values())
    queries = sum(c["prefix_cache_queries"] for c in counters.values())
    hits = sum(c["prefix_cache_hits"] for c in counters.values())
    by_workload: dict[str, dict[str, Any]] = {}
    for name in sorted({row[6] for row in counted}):
        mine = [row for row in counted if row[6] == name]
        by_workload[name] = {
            "requests": len(mine),
            "ttft_ms": quantiles([row[0] for row in mine]),
            "latency_ms": quantiles([row[1] for row in mine]),
        }
    return {
        "outcomes": {
            "requests": len(rows),
            "ok": outcomes.get("ok", 0),
            "unfinished": outcomes.get("unfinished", 0),
            "errors": sum(errors.values()),
            "error_kinds": errors,
        },
        "ttft_ms": quantiles([row[0] for row in counted]),
        "latency_ms": quantiles([row[1] for row in counted]),
        "by_workload": by_workload,
        "throughput": {
            "req_per_s": len(done) / span if span else 0.0,
            "tokens_per_s": sum(row[2] for row in done) / span if span else 0.0,
        },
        "send_lag_ms": quantiles([row[4] for row in rows]),
        "queued": _queued(loads),
        "share": {name: c["started"] / started if started else 0.0 for name, c in counters.items()},
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "backends": {name: dict(c) for name, c in counters.items()},
    }


_STRATEGIES = ("round_robin", "least_inflight", "score")


def _figure(
    report: Mapping[str, Any], scenario: str, arm: str, metric: str, of: str = "ttft_ms"
) -> float | None:
    """An arm's figure; None when it did not run or some of its requests were refused or
    broke: those leave the percentiles (a strategy that sheds its slow requests would look
    fastest), so such an arm is no figure for a target."""
    runs = report.get("scenarios", {}).get(scenario, {}).get("arms", {})
    if runs.get(arm, {}).get("outcomes", {}).get("errors"):
        return None
    value = runs.get(arm, {}).get(of, {}).get(metric)
    return None if value is None else float(value)


def _behind_best(report: Mapping[str, Any], scenario: str, of: str) -> float | None:
    """The scorer's p99 over the best p99 of the three strategies (None if not all ran)."""
    p99s = [_figure(report, scenario, arm, "p99", of) for arm in _STRATEGIES]
    known = [v for v in p99s if v is not None]
    if len(known) < len(_STRATEGIES) or min(known) <= 0:
        return None
    return known[-1] / min(known)


def _unmeasured(report: Mapping[str, Any], scenario: str, arms: Sequence[str]) -> str:
    """Why a target reading `arms` of `scenario` has no value: the scenario did not run,
    an arm is missing, or an arm refused or broke requests (named with their count)."""
    ran = report.get("scenarios", {}).get(scenario)
    if not ran or "error" in ran:
        return f"{scenario} did not run"
    shed = [
        f"{arm} had {errors} refused or broken request(s)"
        for arm in arms
        if (errors := ran.get("arms", {}).get(arm, {}).get("outcomes", {}).get("errors"))
    ]
    if shed:
        return f"{scenario}: " + ", ".join(shed)
    missing = [arm for arm in arms if arm not in ran.get("arms", {})]
    return f"{scenario}: {', '.join(missing)} did not run" if missing else f"{scenario}: no figure"


def _target(
    target_id: str,
    text: str,
    value: float | None,
    limit: float,
    unit: str,
    *,
    at_most: bool,
    why: str | None = None,
) -> dict[str, Any]:
    met = None if value is None else (value <= limit if at_most else value >= limit)
    return {
        "id": target_id,
        "text": text,
        "value": value,
        "target": limit,
        "unit": unit,
        "at_most": at_most,
        "met": met,
        "why_not_measured": None if value is not None else why,
    }


def evaluate_targets(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets with their measured values; `met` is None when not measured."""
    targets = []
    score = _figure(report, "hetero", "score", "p99")
    rr = _figure(report, "hetero", "round_robin", "p99")
    ratio = score / rr if score is not None and rr else None
    targets.append(
        _target(
            "hetero_p99_ttft",
            "heterogeneous pool: score p99 TTFT / round robin's",
            ratio,
            0.5,
            "x",
            at_most=True,
            why=_unmeasured(report, "hetero", ("score", "round_robin")),
        )
    )
    for target_id, of, what in (
        ("uniform_p99_ttft", "ttft_ms", "TTFT"),
        ("uniform_p99_e2e", "latency_ms", "end-to-end latency"),
    ):
        targets.append(
            _target(
                target_id,
                f"uniform pool: score p99 {what} / the best strategy's",
                _behind_best(report, "uniform", of),
                1.05,
                "x",
                at_most=True,
                why=_unmeasured(report, "uniform", _STRATEGIES),
            )
        )
    with_affinity = _figure(report, "prefix", "score", "p50")
    without = _figure(report, "prefix", "score_no_affinity", "p50")
    gain = 1.0 - with_affinity / without if with_affinity is not None and without else None
    targets.append(
        _target(
            "prefix_affinity_gain",
            "shared prefixes: p50 TTFT gain of affinity (1 - with / without)",
            gain,
            0.05,
            "",
            at_most=False,
            why=_unmeasured(report, "prefix", ("score", "score_no_affinity")),
        )
    )
    rows = report.get("decision", {}).get("rows", [])
    worst = max((r["p99_us"] for r in rows if r["strategy"] == "score"), default=None)
    targets.append(
        _target(
            "decision_p99",
            "routing decision (Picker.order, score) p99, worst pool size",
            worst,
            DECISION_BUDGET_US,
            "us",
            at_most=True,
            why="the decision cost did not run",
        )
    )
    return targets


def median_targets(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Each target judged by the median of its values over several traces (`runs`: the
    `evaluate_targets` of each); `per_run` keeps every value. One run: its own targets.
    A trace that did not measure a target (an arm missing, or one with refused requests)
    leaves it not measured: the median of the other traces is not the median of all."""
    combined = []
    for position, first in enumerate(runs[0]):
        values = [run[position]["value"] for run in runs]
        known = [v for v in values if v is not None]
        unmeasured = [
            f"trace {index + 1}: {run[position].get('why_not_measured') or 'no figure'}"
            for index, run in enumerate(runs)
            if run[position]["value"] is None
        ]
        target = _target(
            first["id"],
            first["text"],
            statistics.median(known) if known and len(known) == len(values) else None,
            first["target"],
            first["unit"],
            at_most=first["at_most"],
            why="; ".join(unmeasured) if len(runs) > 1 else first.get("why_not_measured"),
        )
        if len(runs) > 1:
            target["per_run"] = values
        combined.append(target)
    return combined


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _scenario_table(name: str, scenario: Mapping[str, Any]) -> list[str]:
    if "error" in scenario:
        return [f"{name}: FAILED: {scenario['error']}"]
    trace = scenario["trace"]
    capacity = sum(scenario["capacity_req_per_s"].values())
    lines = [
        f"{name}: {scenario['title']}",
        f"  {trace['requests']} requests at {trace['rate']:.1f} req/s "
        f"({trace['rate'] / capacity:.0%} of the computed {capacity:.1f} req/s)",
        f"  {'strategy':<18}{'ok':>5}{'cut':>5}{'err':>5}"
        f"{'ttft p50':>10}{'p95':>7}{'p99':>7}{'e2e p50':>9}{'p95':>7}{'p99':>7}"
        f"{'req/s':>7}{'queued':>8}{'max':>5}  share / prefix-cache hits",
    ]
    for arm, run in scenario["arms"].items():
        out, ttft, e2e = run["outcomes"], run["ttft_ms"], run["latency_ms"]
        queued = run["queued"]
        share = " ".join(f"{b} {v:.0%}" for b, v in run["share"].items())
        hit = run["prefix_cache_hit_rate"]
        lines.append(
            f"  {arm:<18}{out['ok']:>5}{out['unfinished']:>5}{out['errors']:>5}"
            f"{_ms(ttft.get('p50')):>10}{_ms(ttft.get('p95')):>7}{_ms(ttft.get('p99')):>7}"
            f"{_ms(e2e.get('p50')):>9}{_ms(e2e.get('p95')):>7}{_ms(e2e.get('p99')):>7}"
            f"{run['throughput']['req_per_s']:>7.1f}"
            f"{queued.get('mean', 0.0):>8.1f}{queued.get('max', 0):>5}  {share}"
            + ("" if hit is None else f" / {hit:.0%}")
        )
    return lines


def render(report: Mapping[str, Any]) -> str:
    """The text table: scenarios, decision cost, targets."""
    lines = [
        "times in ms from the scheduled arrival; cut = still running at the end (lower bounds)"
    ]
    runs = report.get("runs") or [{"scenarios": report.get("scenarios", {})}]
    for run in runs:
        if "seed" in run:
            lines += ["", f"== trace seed {run['seed']}"]
        for name, scenario in run["scenarios"].items():
            lines += ["", *_scenario_table(name, scenario)]
    decision = report.get("decision", {})
    if decision:
        lines += [
            "",
            f"routing decision cost (Picker.order), {decision['calls']:,} calls per row",
            f"  {'backends':<10}{'strategy':<16}{'p50 us':>8}{'p99 us':>8}{'max us':>8}",
        ]
        for row in decision["rows"]:
            lines.append(
                f"  {row['backends']:<10}{row['strategy']:<16}"
                f"{row['p50_us']:>8.2f}{row['p99_us']:>8.2f}{row['max_us']:>8.1f}"
            )
    lines.append("")
    for target in report.get("targets", []):
        value, limit = target["value"], target["target"]
        sign = "<=" if target["at_most"] else ">="
        if value is None:
            why = target.get("why_not_measured")
            lines.append(f"SKIP  {target['text']}: not measured" + (f" ({why})" if why else ""))
            continue
        verdict = "PASS" if target["met"] else "MISS"
        per_run = target.get("per_run")
        spread = (
            ""
            if per_run is None
            else " median of " + " / ".join("-" if v is None else f"{v:.3f}" for v in per_run)
        )
        lines.append(
            f"{verdict}  {target['text']}: {value:.3f}{target['unit']} "
            f"(target {sign} {limit}{target['unit']}){spread}"
        )
    return "\n".join(lines)
