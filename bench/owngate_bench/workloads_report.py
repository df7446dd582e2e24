"""Ratios, verdicts and the printed table of `owngate bench workloads`.

Every (suite, repetition) ran each target back to back, so ratios are taken per
repetition (gateway ÷ direct of the same repetition) and summarised as their median and
their range over the repetitions. The verdict of a suite reads "within noise" when the
range of every ratio (TTFT p50, ITL p50, output throughput) covers 1.0, otherwise it
names the metric that moved and by how much (the median ratio); a median within 5 % of
1.0 never counts as moved. `pooled_cpu` divides the gateways' CPU summed over all suites
by all their requests and streamed tokens: each window holds only a few 10 ms /proc
ticks, so the per-suite figures are coarse.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["METRICS", "compare", "pooled_cpu", "render", "render_routing"]

# (summary key, label, higher is better)
METRICS = (
    ("median_ttft_ms", "TTFT p50", False),
    ("p99_ttft_ms", "TTFT p99", False),
    ("median_itl_ms", "ITL p50", False),
    ("p99_itl_ms", "ITL p99", False),
    ("output_throughput", "output tok/s", True),
)
# The ratios the verdict reads: p99s of a few requests are too noisy to decide on.
VERDICT_KEYS = ("median_ttft_ms", "median_itl_ms", "output_throughput")
# A ratio whose median is this close to 1.0 does not count as moved even when its range
# misses 1.0 (an open-loop sweep's throughput is set by its arrivals: 1.00-1.01x).
NEGLIGIBLE = 0.05


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def compare(runs: Sequence[Mapping[str, Any]], targets: Sequence[str]) -> dict[str, Any]:
    """Per target: median of each metric over the repetitions, the gateway's CPU per
    request and per output token; per gateway target: ratios to direct and the verdict.

    `runs`: one entry per repetition, {target: client summary + `gateway_cpu_s`}.
    """
    found: dict[str, Any] = {}
    for target in targets:
        summaries = [run[target] for run in runs if target in run]
        row: dict[str, Any] = {
            key: _median([s[key] for s in summaries if s.get("completed")]) for key, _, _ in METRICS
        }
        row["completed"] = sum(int(s.get("completed", 0)) for s in summaries)
        row["failed"] = sum(int(s.get("failed", 0)) for s in summaries)
        # Summed over the repetitions, then divided: /proc counts 10 ms ticks.
        cpu = [s for s in summaries if s.get("gateway_cpu_s") is not None and s.get("completed")]
        if cpu:
            seconds = sum(s["gateway_cpu_s"] for s in cpu)
            row["gateway_cpu_ms_per_request"] = seconds / sum(s["completed"] for s in cpu) * 1e3
            tokens = max(1, sum(s["total_output_tokens"] for s in cpu))
            row["gateway_cpu_us_per_token"] = seconds / tokens * 1e6
            row["gateway_idle_cores"] = cpu[0]["gateway_idle_cores"]
        if target != "direct":
            ratios: dict[str, Any] = {}
            for key, _, _ in METRICS:
                paired = [
                    run[target][key] / run["direct"][key]
                    for run in runs
                    if target in run
                    and "direct" in run
                    and run[target].get("completed")
                    and run["direct"].get("completed")
                    and run["direct"][key]
                ]
                if paired:
                    ratios[key] = {
                        "median": statistics.median(paired),
                        "min": min(paired),
                        "max": max(paired),
                    }
            row["ratios"] = ratios
            direct_failed = sum(
                int(run["direct"].get("failed", 0)) for run in runs if "direct" in run
            )
            row["verdict"] = _unmeasured(row, ratios, direct_failed) or _verdict(ratios, len(runs))
        found[target] = row
    return found


def pooled_cpu(suites: Sequence[Mapping[str, Any]], targets: Sequence[str]) -> dict[str, Any]:
    """Per gateway target: net CPU ms per request and µs per streamed token over every
    window of every suite."""
    found: dict[str, Any] = {}
    for target in targets:
        windows = [
            run[target]
            for suite in suites
            for run in suite["runs"]
            if target in run and run[target].get("gateway_cpu_s") is not None
        ]
        requests = sum(w["completed"] for w in windows)
        if not requests:
            continue
        seconds = sum(w["gateway_cpu_s"] for w in windows)
        tokens = max(1, sum(w["total_output_tokens"] for w in windows))
        found[target] = {
            "requests": requests,
            "tokens": tokens,
            "cpu_s": seconds,
            "gross_cpu_s": sum(w.get("gateway_cpu_gross_s", 0.0) for w in windows),
            "cpu_ms_per_request": seconds / requests * 1e3,
            "cpu_us_per_token": seconds / tokens * 1e6,
        }
    return found


def _unmeasured(
    row: Mapping[str, Any], ratios: Mapping[str, Any], direct_failed: int = 0
) -> str | None:
    """Why a gateway's ratios are no verdict: requests failed through it (a failed request
    is fast and produces no tokens), requests failed direct (the baseline then is the
    survivors' figures and fewer tokens: no yardstick), or a ratio the verdict reads has no
    repetition (none completed, through it or direct). Never "within noise" on what was not
    measured."""
    if row["failed"]:
        return f"not measured: {row['failed']} of its requests failed"
    if direct_failed:
        return f"not measured: {direct_failed} of direct's requests failed (no baseline)"
    missing = [label for key, label, _ in METRICS if key in VERDICT_KEYS and key not in ratios]
    if missing:
        return f"not measured: no repetition completed for {', '.join(missing)}"
    return None


def _verdict(ratios: Mapping[str, Mapping[str, float]], reps: int) -> str:
    if reps < 2:
        return "one repetition: no spread to judge noise (use --reps 3)"
    moved = []
    for key, label, higher_better in METRICS:
        if key not in VERDICT_KEYS or key not in ratios:
            continue
        ratio = ratios[key]
        if ratio["min"] <= 1.0 <= ratio["max"] or abs(ratio["median"] - 1.0) < NEGLIGIBLE:
            continue
        worse = (ratio["median"] < 1.0) if higher_better else (ratio["median"] > 1.0)
        moved.append(f"{label} {'worse' if worse else 'better'} ({ratio['median']:.3g}x)")
    if not moved:
        return (
            f"within noise: every ratio's range over {reps} repetitions covers 1.0 "
            f"(or its median is within {NEGLIGIBLE:.0%} of it)"
        )
    return "gateway ÷ direct outside noise: " + ", ".join(moved)


def _fmt(value: float | None, digits: str = ".1f") -> str:
    return "-" if value is None else format(value, digits)


def render(report: Mapping[str, Any]) -> str:
    """The table: one block per suite, one line per target, then the verdicts."""
    lines = [
        f"owngate bench workloads: backend {report['backend']}, scale 1/{report['scale']:g}, "
        f"{report['reps']} interleaved repetitions, machine busy "
        f"{report['machine']['busy_cores']:.2f} of {report['machine']['cores']} cores",
    ]
    answers = report.get("known_answer")
    if answers:
        lines.append(
            "the known question (What is the capital of France?), asked before measuring: "
            + "; ".join(f"{t} {a.strip()[:60]!r}" for t, a in answers.items())
        )
    header = (
        f"  {'target':20} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
        f"{'tok/s':>7} {'gw CPU ms/req':>13} {'µs/token':>8}  ratios TTFT/ITL/tok/s (range)"
    )
    for suite in report["suites"]:
        shape = suite["shape"]
        lines.append("")
        lines.append(
            f"{suite['name']}: {shape['input_len']} in / {shape['output_len']} out, "
            f"{shape['num_prompts']} requests, rate {shape['request_rate']}, "
            f"concurrency {shape['max_concurrency']} (seed: {suite['seed_shape']})"
        )
        lines.append(header)
        for target, row in suite["targets"].items():
            ratios = row.get("ratios", {})
            ratio_text = " / ".join(
                f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"
                for r in (ratios.get(k) for k in VERDICT_KEYS)
                if r is not None
            )
            lines.append(
                f"  {target:20} {_fmt(row['median_ttft_ms']):>9} {_fmt(row['p99_ttft_ms']):>9} "
                f"{_fmt(row['median_itl_ms']):>8} {_fmt(row['p99_itl_ms']):>8} "
                f"{_fmt(row['output_throughput']):>7} "
                f"{_fmt(row.get('gateway_cpu_ms_per_request'), '.2f'):>13} "
                f"{_fmt(row.get('gateway_cpu_us_per_token'), '.0f'):>8}  {ratio_text}"
                + (f"  FAILED {row['failed']}" if row["failed"] else "")
            )
        for target, row in suite["targets"].items():
            if "verdict" in row:
                lines.append(f"  verdict {target}: {row['verdict']}")
    pooled = report.get("pooled_cpu") or {}
    if pooled:
        lines.append("")
        lines.append("gateway CPU over all suites (net of its idle CPU, from /proc):")
        for target, row in pooled.items():
            lines.append(
                f"  {target:20} {row['cpu_ms_per_request']:.2f} ms per request, "
                f"{row['cpu_us_per_token']:.0f} µs per streamed token "
                f"({row['requests']} requests, {row['tokens']} tokens, {row['cpu_s']:.2f} s)"
            )
    if report.get("routing"):
        lines += ["", *render_routing(report["routing"])]
    benchy = report.get("llama_benchy")
    if isinstance(benchy, dict):
        from owngate_bench.workloads_benchy import render_benchy

        lines += ["", *render_benchy(benchy)]
    elif benchy:
        lines += ["", f"llama-benchy: {benchy}"]
    return "\n".join(lines)


def render_routing(routing: Mapping[str, Any]) -> list[str]:
    shape = routing["shape"]
    lines = [
        f"routing on real servers: {', '.join(routing['servers'])}; {shape['num_prompts']} "
        f"requests of {shape['input_len']} in / {shape['output_len']} out at "
        f"{shape['request_rate']} req/s, {routing['reps']} repetitions",
        f"  {'strategy':15} {'TTFT p50':>9} {'TTFT p99':>9} {'E2EL p99':>9} {'tok/s':>7}"
        "  TTFT p99 per repetition",
    ]
    for strategy, row in routing["strategies"].items():
        per_rep = ", ".join(_fmt(v, ".0f") for v in row["p99_ttft_ms_per_rep"])
        lines.append(
            f"  {strategy:15} {_fmt(row['median_ttft_ms']):>9} {_fmt(row['p99_ttft_ms']):>9} "
            f"{_fmt(row['p99_e2el_ms']):>9} {_fmt(row['output_throughput']):>7}  {per_rep}"
        )
    lines.append(f"  verdict: {routing['verdict']}")
    return lines
