"""Routing benchmark: round robin, least in-flight and owngate's scorer on the same traces.

`owngate bench routing` builds simulated pools, generates one seeded open-loop trace per
scenario (`owngate_bench.arrivals`), and replays that same trace once per routing
strategy, each time against fresh simulators (`SimHost`, in this process) and a fresh
owngate (`owngate serve`, its own process), with the client in yet another process
(`owngate_bench.openloop`). The scenarios (`hetero`, `uniform`, `prefix`), the strategies
compared in each, and how time is scaled so a run takes seconds: routing_scenarios.py.

With `--seeds N` every scenario runs on N traces (seeds `--seed` .. `--seed` + N - 1) and
each target is judged by the median of its N values: on one trace a p99 moves by
10-20 % from one strategy's luck with the bursts, so a single trace cannot tell 5 % apart.

The report: per scenario and strategy, TTFT and end-to-end latency p50/p95/p99 (from the
scheduled arrival; requests still running `--grace` seconds after the last arrival are
cut off and count with their time so far, a lower bound), throughput, requests queued
in the servers (sampled), each server's share; then the cost of one routing decision
(`owngate_bench.decision`) and the targets. JSON goes to `--json`; the traces, gateway
configs and logs to `routing-run/` next to it.

Exit codes: 0 ran cleanly; 1 a run failed or had errors (or, with `--check`, a target
was missed); 2 usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway import __version__
from owngate_bench.arrivals import TraceSpec, build_trace, write_trace
from owngate_bench.openloop import ReplaySpec, replay_in_subprocess
from owngate_bench.routing_report import evaluate_targets, median_targets, render, summarize
from owngate_bench.routing_scenarios import (
    ARMS,
    MODEL,
    OUTPUT_SCALE,
    Arm,
    Scenario,
    capacity,
    scenarios,
)
from owngate_bench.services import (
    HOST,
    Service,
    child_env,
    free_port,
    owngate_argv,
    tree_cpu_seconds,
)

__all__ = ["add_arguments", "gateway_config", "run"]

_SCRAPE_INTERVAL_S = 0.5  # the gateway's defaults, divided by the time scale in runs
_SCRAPE_STALENESS_S = 3.0


def _env(name: str, default: str) -> str:
    return os.environ.get(f"OWNGATE_BENCH_ROUTING_{name}", default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, each with an OWNGATE_BENCH_ROUTING_* environment default."""
    add = parser.add_argument
    add(
        "--duration",
        type=float,
        default=_env("DURATION", "20"),
        help="seconds of arrivals per scenario (env OWNGATE_BENCH_ROUTING_DURATION, 20)",
    )
    add(
        "--grace",
        type=float,
        default=_env("GRACE", "5"),
        help="seconds requests may run after the last arrival before they are cut off "
        "(env OWNGATE_BENCH_ROUTING_GRACE, 5)",
    )
    add(
        "--load",
        type=float,
        default=_env("LOAD", "0.85"),
        help="arrival rate as a fraction of the pool's computed capacity "
        "(env OWNGATE_BENCH_ROUTING_LOAD, 0.85)",
    )
    add(
        "--speed",
        type=float,
        default=_env("SPEED", "2"),
        help="extra time scale: decode and prefill this much faster, scrapes this much more "
        "often (env OWNGATE_BENCH_ROUTING_SPEED, 2)",
    )
    add(
        "--scenarios",
        default=_env("SCENARIOS", "hetero,uniform,prefix"),
        help="comma-separated scenarios of hetero, uniform, prefix "
        "(env OWNGATE_BENCH_ROUTING_SCENARIOS)",
    )
    add(
        "--arms",
        default=_env("ARMS", ""),
        help=f"comma-separated routing configurations to run in every scenario, of "
        f"{', '.join(ARMS)} (default: each scenario's own; env OWNGATE_BENCH_ROUTING_ARMS)",
    )
    add(
        "--seed",
        type=int,
        default=_env("SEED", "1"),
        help="trace seed (env OWNGATE_BENCH_ROUTING_SEED, 1)",
    )
    add(
        "--seeds",
        type=int,
        default=_env("SEEDS", "1"),
        help="run every scenario on this many traces (seeds --seed, --seed + 1, ...) and "
        "judge each target by its median over them: one trace's p99 moves by +-10-20 %% "
        "(env OWNGATE_BENCH_ROUTING_SEEDS, 1)",
    )
    add(
        "--json",
        type=Path,
        default=_env("JSON", ".bench/routing.json"),
        help="where to write the results (env OWNGATE_BENCH_ROUTING_JSON, .bench/routing.json)",
    )
    add(
        "--decision-calls",
        type=int,
        default=_env("DECISION_CALLS", "0"),
        help="timed routing decisions per row, 0 = 100,000 (5,000 with --quick)",
    )
    add(
        "--quick",
        action="store_true",
        default=_env("QUICK", "") in {"1", "true", "yes", "on"},
        help="a very short run for smoke tests: numbers mean little (env ..._QUICK=1)",
    )
    add(
        "--check",
        action="store_true",
        default=_env("CHECK", "") in {"1", "true", "yes", "on"},
        help="exit 1 when a target is missed (env OWNGATE_BENCH_ROUTING_CHECK=1)",
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    scenarios: tuple[Scenario, ...]
    duration_s: float
    grace_s: float
    load: float
    speed: float
    seeds: tuple[int, ...]
    json_path: Path
    decision_calls: int
    quick: bool
    check: bool


def _plan(args: argparse.Namespace) -> _Plan:
    if not (args.duration > 0 and args.grace >= 0 and args.load > 0 and args.speed > 0):
        raise ValueError("--duration, --load and --speed must be > 0, --grace >= 0")
    if args.decision_calls < 0:
        raise ValueError("--decision-calls must be >= 0")
    if args.seeds < 1:
        raise ValueError("--seeds must be >= 1")
    known = {s.name: s for s in scenarios(args.speed)}
    wanted = [name.strip() for name in str(args.scenarios).split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(known))
    if unknown or not wanted:
        raise ValueError(f"--scenarios takes names of {', '.join(known)}, got {args.scenarios!r}")
    chosen = [known[name] for name in known if name in wanted]
    arms = tuple(name.strip() for name in str(args.arms).split(",") if name.strip())
    if sorted(set(arms) - set(ARMS)):
        raise ValueError(f"--arms takes names of {', '.join(ARMS)}, got {args.arms!r}")
    if arms:
        chosen = [dataclasses.replace(s, arms=arms) for s in chosen]
    elif args.quick:  # the scorer against the baseline each scenario is about
        chosen = [
            dataclasses.replace(
                s, arms=("score", "score_no_affinity" if s.name == "prefix" else "round_robin")
            )
            for s in chosen
        ]
    return _Plan(
        scenarios=tuple(chosen),
        duration_s=min(args.duration, 1.0) if args.quick else args.duration,
        grace_s=min(args.grace, 0.5) if args.quick else args.grace,
        load=args.load,
        speed=args.speed,
        seeds=tuple(range(args.seed, args.seed + (1 if args.quick else args.seeds))),
        json_path=args.json,
        decision_calls=args.decision_calls or (5_000 if args.quick else 100_000),
        quick=args.quick,
        check=args.check,
    )


def gateway_config(
    scenario: Scenario, arm: Arm, ports: dict[str, int], port: int, key_hash: str, speed: float
) -> str:
    """The gateway.yaml of one run: the scenario's backends on `ports`, the arm's routing,
    scrape interval and staleness divided by the time scale, one tenant with `key_hash`."""
    lines = [
        f"listen: {{host: {HOST}, port: {port}}}",
        "logging: {format: json, level: warning, access_log: false}",
        f"scrape: {{interval_s: {_SCRAPE_INTERVAL_S / (OUTPUT_SCALE * speed)!r}, "
        f"staleness_s: {_SCRAPE_STALENESS_S / (OUTPUT_SCALE * speed)!r}, timeout_s: 0.5}}",
        f"routing: {{default: {{strategy: {arm.strategy}, "
        f"weights: {{affinity: {arm.affinity}, prefill: {arm.prefill}}}}}}}",
        "backends:",
    ]
    for name, settings in scenario.backends:
        capacity_hint = f", capacity: {{max_concurrency: {settings.slots}}}"
        lines.append(
            f"  - {{id: {name}, kind: {settings.kind}, base_url: 'http://{HOST}:{ports[name]}', "
            f"models: [{{name: {MODEL}}}], region: local, owner: bench"
            f"{capacity_hint if arm.declare_slots else ''}}}"
        )
    lines += ["tenants:", f"  - {{id: bench, api_key_hashes: ['{key_hash}'], models: ['*']}}"]
    return "\n".join(lines) + "\n"


def _run_arm(
    plan: _Plan,
    scenario: Scenario,
    arm: Arm,
    trace_path: Path,
    rundir: Path,
    api_key: str,
) -> dict[str, Any]:
    """One replay of the scenario's trace against fresh simulators and a fresh gateway."""
    from owngate_bench.simhost import SimHost

    key_hash = "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()
    with SimHost(scenario.backends, HOST) as host:
        port = free_port()
        config = rundir / f"{scenario.name}-{arm.name}.yaml"
        config.write_text(gateway_config(scenario, arm, host.ports, port, key_hash, plan.speed))
        argv = owngate_argv("serve", "--config", str(config))
        gateway = Service.start(
            f"gateway-{scenario.name}-{arm.name}", argv, child_env(), rundir, port
        )
        try:
            gateway.wait_ready("/readyz", {}, 30.0)
            spec = ReplaySpec(HOST, port, api_key, str(trace_path), plan.grace_s)
            cpu_before = tree_cpu_seconds(gateway.proc.pid)
            started = time.monotonic()
            replayed = replay_in_subprocess(
                spec, plan.duration_s + plan.grace_s + 60.0, env=child_env()
            )
            ended = time.monotonic()
            gateway_cpu = tree_cpu_seconds(gateway.proc.pid) - cpu_before
        finally:
            gateway.stop()
        loads = {name: load.between(started, ended) for name, load in host.loads.items()}
        counters = host.counters()
    return {
        "arm": dataclasses.asdict(arm),
        "gateway_cpu_s": gateway_cpu,
        **summarize(replayed, counters, loads),
    }


def _run_scenario(
    plan: _Plan,
    scenario: Scenario,
    seed: int,
    rundir: Path,
    api_key: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    spec = TraceSpec(
        mix=scenario.mix,
        rate=1.0,  # set below from capacity
        duration_s=plan.duration_s,
        burstiness=scenario.burstiness,
        output_scale=1.0 / OUTPUT_SCALE,
        seed=seed,
        model=MODEL,
    )
    prompt, output = spec.mean("prompt_tokens"), spec.mean("output_tokens")
    capacities = {name: capacity(s, prompt, output) for name, s in scenario.backends}
    rate = plan.load * sum(capacities.values())
    spec = dataclasses.replace(spec, rate=rate)
    trace = build_trace(spec)
    trace_path = rundir / f"{scenario.name}.trace.jsonl"
    write_trace(trace_path, trace)
    log(
        f"{scenario.name} (seed {seed}): {len(trace)} requests at {rate:.1f} req/s "
        f"({plan.load:.0%} of capacity)"
    )
    results: dict[str, Any] = {}
    for name in scenario.arms:
        began = time.monotonic()
        results[name] = _run_arm(plan, scenario, ARMS[name], trace_path, rundir, api_key)
        log(f"  {name}: {time.monotonic() - began:.1f}s")
    return {
        "title": scenario.title,
        "trace": {**spec.describe(), "requests": len(trace)},
        "capacity_req_per_s": capacities,
        "backends": {name: dataclasses.asdict(s) for name, s in scenario.backends},
        "arms": results,
    }


def run(args: argparse.Namespace) -> int:
    """Run the benchmark as the parsed flags say; returns the exit code."""
    try:
        plan = _plan(args)
    except ValueError as exc:
        print(f"owngate bench routing: {exc}", file=sys.stderr)
        return 2

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    began = time.monotonic()
    rundir = plan.json_path.parent / "routing-run"
    rundir.mkdir(parents=True, exist_ok=True)
    api_key = "og-bench-" + secrets.token_hex(16)
    report: dict[str, Any] = {
        "schema": "owngate.bench.routing/1",
        "owngate": __version__,
        "python": platform.python_version(),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "settings": {
            "duration_s": plan.duration_s,
            "grace_s": plan.grace_s,
            "load": plan.load,
            "speed": plan.speed,
            "output_scale": 1.0 / OUTPUT_SCALE,
            "seeds": list(plan.seeds),
            "quick": plan.quick,
        },
        "scenarios": {},
    }
    failed = False
    runs: list[dict[str, Any]] = []
    for seed in plan.seeds:
        found: dict[str, Any] = {}
        for scenario in plan.scenarios:
            try:
                found[scenario.name] = _run_scenario(plan, scenario, seed, rundir, api_key, log)
            except (RuntimeError, OSError, TimeoutError) as exc:
                log(f"{scenario.name} (seed {seed}): failed: {exc}")
                found[scenario.name] = {"error": str(exc)}
                failed = True
        runs.append({"seed": seed, "scenarios": found})
    report["scenarios"] = runs[0]["scenarios"]
    from owngate_bench.decision import decision_cost

    log(f"timing routing decisions ({plan.decision_calls} calls per row)")
    report["decision"] = decision_cost(plan.decision_calls)
    for run_ in runs:
        run_["targets"] = evaluate_targets({**run_, "decision": report["decision"]})
    report["targets"] = median_targets([run_["targets"] for run_ in runs])
    if len(runs) > 1:
        report["runs"] = runs
    report["elapsed_s"] = time.monotonic() - began
    plan.json_path.parent.mkdir(parents=True, exist_ok=True)
    plan.json_path.write_text(_dumps(report))
    print(render(report))
    print(f"\nwrote {plan.json_path} ({report['elapsed_s']:.0f}s in all)")
    errors = sum(
        arm["outcomes"].get("errors", 0)
        for run_ in runs
        for scenario in run_["scenarios"].values()
        for arm in scenario.get("arms", {}).values()
    )
    if failed or errors:
        return 1
    if plan.check and any(t["met"] is False for t in report["targets"]):
        return 1
    return 0


def _dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str) + "\n"
