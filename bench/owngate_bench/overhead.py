"""Overhead benchmark: the same load, side by side, to the simulator, nginx, owngate and LiteLLM.

`owngate bench overhead` starts zero-latency vLLM simulators (one writing streams back
to back, "coalesced", and one pacing them one token per write 20 ms apart, "paced"),
nginx as a bare reverse proxy (one worker; skipped when not installed), owngate in five
configurations (plain; owngate+policy, a generated trust-policy set; owngate+tracing,
OpenTelemetry on; owngate+accesslog, its JSON access line written; owngate+production,
issue 16's production configuration: policy set, provenance log, score routing over two
backends and the access log) and LiteLLM's proxy (pinned release in its own
virtualenv, one worker, no database) as separate processes; see
`owngate_bench.overhead_targets`. Then, per load point (`owngate_bench.overhead_points`:
chat c=1/16/64, coalesced streams c=16/64, paced streams c=256, chat with 1/32/100 KB
prompts at c=16), it runs `--reps` repetitions, each sending the same load to every
target in turn (an order rotated each repetition) with a load generator in yet another
process (`owngate_bench.loadgen`), and reports medians. CPU seconds of each server's
process tree are read from /proc around every measured window: steadier than req/s on
a shared machine. Once the servers are stopped, it times the policy decisions (cached
and uncached) of the owngate configs. It prints a table, the issue's targets as verdicts
(`owngate_bench.overhead_verdicts`) and the earlier checks, and writes JSON with every
repetition.

Exit codes: 0 ran cleanly; 1 a target failed or returned errors (or, with `--check`, a
target was missed or a verdict was not met: not met, or not measured); 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway import __version__
from owngate_bench import litellm_proxy
from owngate_bench.loadgen import LoadSpec, run_in_subprocess
from owngate_bench.overhead_options import Plan, add_arguments, plan_from
from owngate_bench.overhead_points import PACED_MODEL, POINTS, Point, derive, fold, rotated
from owngate_bench.overhead_policy import decision_cost
from owngate_bench.overhead_report import evaluate_checks, policy_comparison, render
from owngate_bench.overhead_targets import ACCESS_LOGGED, MODEL, TARGETS, Target, started
from owngate_bench.overhead_tracing import (
    TraceSink,
    on_off_comparison,
    render_on_off,
    render_tracing,
    tracing_comparison,
)
from owngate_bench.overhead_verdicts import body_table, chunk_table, render_verdicts, verdicts
from owngate_bench.services import HOST, child_env

__all__ = ["POINTS", "TARGETS", "Point", "add_arguments", "run"]


def _measure(
    plan: Plan, targets: list[Target], api_key: str, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Each load point, `plan.reps` times, against every running target that takes part
    in it, in an order rotated from one repetition (and point) to the next; one row per
    point with every repetition and the medians (`fold`)."""
    rows: list[dict[str, Any]] = []
    python_env = child_env()
    for index, point in enumerate(plan.points):
        names = [t.name for t in targets if t.runs(point)]
        by_name = {t.name: t for t in targets}
        reps: list[dict[str, Any]] = []
        for rep in range(plan.reps):
            order = rotated(names, index + rep)
            results: dict[str, Any] = {}
            for name in order:
                results[name] = _run_one(plan, point, by_name[name], api_key, python_env)
                log(_progress(point, rep, name, results[name]))
            reps.append({"order": order, "results": results})
        rows.append(
            {
                **dataclasses.asdict(point),
                "max_tokens": point.max_tokens,
                "targets": names,
                "reps": reps,
                "results": {n: fold([r["results"][n] for r in reps]) for n in names},
            }
        )
    return rows


def _run_one(
    plan: Plan, point: Point, target: Target, api_key: str, env: Mapping[str, str]
) -> dict[str, Any]:
    paced = point.paced
    spec = LoadSpec(
        host=HOST,
        port=target.port(point),
        api_key=api_key,
        model=PACED_MODEL if paced else MODEL,
        stream=point.stream,
        concurrency=point.concurrency,
        max_tokens=point.max_tokens,
        prompt_bytes=point.prompt_bytes,
        duration_s=plan.duration_s,
        warmup_s=plan.warmup_s,
        # paced: one stream per connection warms up (each takes ~1.3 s)
        warmup_requests=point.concurrency if paced else (50 if plan.quick else 2000),
        max_requests=plan.max_requests,
        cpu_pids=target.cpu_pids(point),
    )
    try:
        return derive(run_in_subprocess(spec, env=env))
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)[-2000:]}


def _progress(point: Point, rep: int, name: str, result: Mapping[str, Any]) -> str:
    where = f"  {point.name:<15} #{rep + 1} {name:<19}"
    if "error" in result:
        return f"{where} failed: {result['error'][:300]}"
    rate = f" {result['chunks_per_s']:>9,.0f} chunks/s" if point.stream else ""
    cpu = result.get("cpu_us_per_chunk") if point.stream else result.get("cpu_ms_per_req")
    unit = "us/chunk" if point.stream else "ms/req"
    cost = f" cpu {cpu:.3f} {unit}" if cpu is not None else ""
    errors = f", {result['errors']} errors" if result["errors"] else ""
    return (
        f"{where} {result['requests']:>7,} req {result['req_per_s']:>9,.0f} req/s"
        f"{rate}{cost}{errors}"
    )


def _machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": list(os.getloadavg()),
    }


def run(args: argparse.Namespace) -> int:
    """Run the benchmark with parsed arguments; print the table and write the JSON."""
    try:
        plan = plan_from(args)
    except ValueError as exc:
        print(f"owngate bench overhead: {exc}", file=sys.stderr)
        return 2
    started_at = time.time()
    clock = time.monotonic()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    api_key = "sk-bench-" + secrets.token_hex(16)
    rundir = plan.json_path.parent.absolute() / "overhead-run"
    rundir.mkdir(parents=True, exist_ok=True)
    machine = _machine()
    log(
        f"overhead benchmark: {', '.join(plan.targets)}; {len(plan.points)} points, "
        f"{plan.reps} rep(s) of {plan.duration_s:g}s"
    )
    paced = any(p.paced for p in plan.points)
    litellm = (plan.litellm_venv, plan.litellm_version)
    try:
        # The sink outlives the gateways: their spans are flushed as they stop.
        with (
            TraceSink(HOST) as sink,
            started(plan.targets, paced, litellm, rundir, api_key, log, sink) as targets,
        ):
            rows = _measure(plan, targets, api_key, log)
    except RuntimeError as exc:
        log(f"owngate bench overhead: {exc}")
        return 1
    machine["loadavg_at_end"] = list(os.getloadavg())
    decisions = _decisions(plan, targets, log)  # the servers are stopped: a quiet machine
    report = _report(plan, machine, targets, rows, decisions, sink)
    report["wall_s"] = time.monotonic() - clock
    report["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at))
    plan.json_path.parent.mkdir(parents=True, exist_ok=True)
    plan.json_path.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(_render_all(report)))
    print(f"\nwrote {plan.json_path} ({report['wall_s']:.0f}s in all)")
    return _exit_code(report, plan.check)


def _report(
    plan: Plan,
    machine: dict[str, Any],
    targets: Sequence[Target],
    rows: list[dict[str, Any]],
    decisions: dict[str, Any],
    sink: TraceSink,
) -> dict[str, Any]:
    versions = {"owngate": __version__, "litellm": None}
    if "litellm" in plan.targets:
        versions["litellm"] = litellm_proxy.installed_version(plan.litellm_venv)
    return {
        "schema": "owngate.bench.overhead/2",
        "machine": machine,
        "versions": versions,
        "settings": {
            "targets": list(plan.targets),
            "points": [p.name for p in plan.points],
            "reps": plan.reps,
            "duration_s": plan.duration_s,
            "warmup_s": plan.warmup_s,
            "max_requests": plan.max_requests,
            "quick": plan.quick,
            "gateway_workers": 1,
            "litellm_workers": 1,
            "nginx_workers": 1,
            "policy_calls": plan.policy_calls,
        },
        "targets": {target.name: target.describe() for target in targets},
        "points": rows,
        "policy": {"decisions": decisions, "vs_owngate": policy_comparison(rows)},
        "checks": evaluate_checks(rows, decisions),
        "verdicts": verdicts(rows),
        "tracing": {
            "vs_owngate": tracing_comparison(rows),
            "sink": {"exports": sink.exports, "bytes": sink.bytes},
        },
        "access_log": {"vs_owngate": on_off_comparison(rows, ACCESS_LOGGED)},
    }


def _render_all(report: Mapping[str, Any]) -> list[str]:
    access_heading = (
        "access log on vs off (owngate+accesslog ÷ owngate; one JSON line per request, "
        "written to a file)"
    )
    ran = [t for t in report["settings"]["targets"] if "error" not in report["targets"][t]]
    return [
        render(report),
        *render_tracing(report["tracing"]["vs_owngate"], report["tracing"]["sink"]),
        *render_on_off(report["access_log"]["vs_owngate"], access_heading),
        *chunk_table(report["points"], ran),
        *body_table(report["points"], ran),
        *render_verdicts(report["verdicts"], report["settings"]["reps"]),
    ]


def _decisions(plan: Plan, targets: Sequence[Target], log: Callable[[str], None]) -> dict[str, Any]:
    """Per owngate target with its own policy set that started: the cost of its decisions."""
    from gateway.config import ConfigError
    from gateway.policy import PolicyError

    found: dict[str, Any] = {}
    for target in targets:
        if target.name not in ("owngate", "owngate+policy") or target.service is None:
            continue  # the other owngates decide as one of these two does
        assert target.config is not None
        try:
            found[target.name] = decision_cost(target.config, plan.policy_calls)
        except (ConfigError, PolicyError, OSError, ValueError) as exc:
            found[target.name] = {"error": str(exc)[-2000:]}
        log(_decision_progress(target.name, found[target.name]))
    return found


def _decision_progress(name: str, cost: Mapping[str, Any]) -> str:
    if "error" in cost:
        return f"  decisions    {name:<14} failed: {cost['error'][:300]}"
    cached, uncached = cost["cached"], cost["uncached"]
    return (
        f"  decisions    {name:<14} {cost['keys']} keys, {cost['calls']:,} calls: "
        f"cached p50 {cached['p50_us']:.2f} us p99 {cached['p99_us']:.2f} us, "
        f"uncached p50 {uncached['p50_us']:.2f} us p99 {uncached['p99_us']:.2f} us"
    )


def _exit_code(report: Mapping[str, Any], check: bool) -> int:
    """1 when a target did not start (nginx merely not installed excepted), a repetition
    failed or saw errors, or a decision failed; with `check`, also a missed target or a
    verdict that is not met (not met, or not measured)."""
    from owngate_bench.overhead_nginx import NGINX_MISSING

    decisions = report.get("policy", {}).get("decisions", {})
    broken = (
        any(
            "error" in entry and entry["error"] != NGINX_MISSING
            for entry in report["targets"].values()
        )
        or any(
            "error" in result or result["errors"]
            for row in report["points"]
            for rep in row["reps"]
            for result in rep["results"].values()
        )
        or any("error" in cost or cost["refused_keys"] for cost in decisions.values())
    )
    # With `check`, a verdict not measured (a point not run, a target that failed or
    # fell behind, nginx missing) is missed as well: 0 only when every verdict is met.
    missed = check and (
        any(c["passed"] is False for c in report["checks"])
        or any(v["met"] is not True for v in report["verdicts"])
    )
    return 1 if broken or missed else 0
