"""Seed-load benchmark: one GH200's streams through one gateway worker, side by side.

The seeds' headline server serves ~200 requests/s and ~23,000 streamed tokens/s, one
token per chunk. `owngate bench seed-load` replays that output with the simulator pacing
one write per token (`owngate sim --zero-latency --token-interval`; 115 tokens per
stream, 20 ms apart by default: ~460 open streams) and open-loop Poisson arrivals at
200 streams/s (`owngate_bench.seedclient`, its own process), bounded in time
(`--duration`) and count (`--requests`). Targets, interleaved in each of `--reps`
repetitions (the order rotates): the simulator itself (`direct`), one nginx worker
(when installed), owngate plain and owngate in the production configuration (see
`owngate_bench.seedload_targets`). Per target it reports the medians of: cores used by
the server's process tree (/proc, over the measured window), CPU per request and per
relayed chunk, TTFT p50/p99, ITL p99, and TTFT p99 added vs direct in the same
repetition; then the verdicts (production: at most 0.5 core, at most 2 ms of TTFT p99
added).

A Python client, the simulator and the gateway cannot all keep 23,000 chunks/s on a
2-core machine: the client's own CPU is measured, and the report says when it could not
drive the load. `--scale` runs a fraction of it (arrivals x scale, streams unchanged):
per-request and per-chunk figures hold, cores are projected to the full load (/ scale).

Exit codes: 0 ran cleanly; 1 a target failed or returned errors (with `--check`: or a
verdict was not met); 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from owngate_bench.seedclient import SeedSpec, run_in_subprocess
from owngate_bench.seedload_report import render, summarise
from owngate_bench.seedload_targets import (
    MODEL,
    NGINX_MISSING,
    PRODUCTION,
    TARGETS,
    Target,
    started,
)
from owngate_bench.services import HOST, Service, child_env, env_flag, histogram_quantile

__all__ = ["add_arguments", "run"]

FULL_RATE = 200.0  # streams per second of the seeds' GH200
TOKENS = 115  # per stream: 200 x 115 = 23,000 tokens/s
# what the log adds to TTFT: the dispatch record made durable before the upstream send
DISPATCH_WAIT = "owngate_provenance_dispatch_wait_seconds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, each with an OWNGATE_BENCH_* environment default."""
    add = parser.add_argument
    add(
        "--duration",
        type=float,
        default=env_flag("DURATION", "20"),
        help="seconds of arrivals per target and repetition (env OWNGATE_BENCH_DURATION, 20)",
    )
    add(
        "--scale",
        type=float,
        default=env_flag("SCALE", "1"),
        help="fraction of the seed load's arrivals to send, 0 < scale <= 1 "
        "(env OWNGATE_BENCH_SCALE, 1)",
    )
    add(
        "--reps",
        type=int,
        default=env_flag("REPS", "3"),
        help="interleaved repetitions, medians reported (env OWNGATE_BENCH_REPS, 3)",
    )
    add(
        "--rate",
        type=float,
        default=env_flag("RATE", f"{FULL_RATE:g}"),
        help=f"full-load streams per second before --scale ({FULL_RATE:g})",
    )
    add(
        "--tokens",
        type=int,
        default=env_flag("TOKENS", str(TOKENS)),
        help=f"tokens (chunks) per stream ({TOKENS})",
    )
    add(
        "--token-interval",
        type=float,
        default=env_flag("TOKEN_INTERVAL", "0.02"),
        help="seconds between a stream's token writes (0.02: 50 tokens/s per stream)",
    )
    add(
        "--requests",
        type=int,
        default=env_flag("REQUESTS", "0"),
        help="cap on streams per run, 0 = 1.5 x rate x duration (env OWNGATE_BENCH_REQUESTS)",
    )
    add(
        "--targets",
        default=env_flag("SEED_TARGETS", ",".join(TARGETS)),
        help=f"comma-separated, of {', '.join(TARGETS)} (env OWNGATE_BENCH_SEED_TARGETS)",
    )
    add(
        "--json",
        type=Path,
        default=env_flag("SEED_JSON", ".bench/seed-load.json"),
        help="where to write the results (env OWNGATE_BENCH_SEED_JSON, .bench/seed-load.json)",
    )
    add(
        "--check",
        action="store_true",
        help="exit 1 when a verdict is not met",
    )


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    names = [t.strip() for t in str(args.targets).split(",") if t.strip()]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown or not names:
        raise ValueError(f"--targets takes names of {', '.join(TARGETS)}, got {args.targets!r}")
    if "direct" not in names:
        names.insert(0, "direct")  # the baseline of "added"
    if not (0 < args.scale <= 1) or args.reps < 1 or args.duration <= 0 or args.requests < 0:
        raise ValueError("--scale must be in (0, 1], --reps >= 1, --duration > 0, --requests >= 0")
    if args.rate <= 0 or args.tokens < 1 or not (0 < args.token_interval <= 1):
        raise ValueError("--rate > 0, --tokens >= 1 and 0 < --token-interval <= 1")
    rate = args.rate * args.scale
    stream_s = args.tokens * args.token_interval
    # measure once the open streams reached their steady number, and leave some window
    warmup = min(stream_s + 0.5, args.duration / 2)
    return {
        "targets": [t for t in TARGETS if t in names],
        "full_rate": args.rate,
        "scale": args.scale,
        "rate": rate,
        "tokens": args.tokens,
        "token_interval_s": args.token_interval,
        "chunks_per_s": rate * args.tokens,
        "open_streams": rate * stream_s,
        "duration_s": args.duration,
        "warmup_s": warmup,
        "grace_s": 2 * stream_s + 5.0,
        "max_requests": args.requests or math.ceil(1.5 * rate * args.duration) + 10,
        "reps": args.reps,
        "cpu_count": os.cpu_count(),
    }


def _spec(
    settings: dict[str, Any], port: int, api_key: str, pids: dict[str, int], seed: int
) -> SeedSpec:
    return SeedSpec(
        host=HOST,
        port=port,
        api_key=api_key,
        model=MODEL,
        rate=settings["rate"],
        duration_s=settings["duration_s"],
        max_tokens=settings["tokens"],
        warmup_s=settings["warmup_s"],
        grace_s=settings["grace_s"],
        max_requests=settings["max_requests"],
        connections=min(2000, math.ceil(1.2 * settings["open_streams"]) + 8),
        seed=seed,
        cpu_pids=pids,
    )


def _start(
    stack: contextlib.ExitStack,
    settings: dict[str, Any],
    rundir: Path,
    api_key: str,
    log: Callable[[str], None],
) -> tuple[list[Service], list[Target]]:
    """The servers, started in `stack`; up to 3 tries, as a busy machine's other programs
    may take a port we picked before our server binds it."""
    for attempt in range(1, 4):
        try:
            return stack.enter_context(
                started(settings["targets"], settings["token_interval_s"], rundir, api_key, log)
            )
        except RuntimeError as exc:
            if attempt == 3:
                raise
            log(f"  start failed ({str(exc)[:300]}); trying again on new ports")
    raise AssertionError("unreachable")


def _quantiles_ms(before: dict[float, float], after: dict[float, float]) -> dict[str, float]:
    """p50/p99 (ms) of what the gateway's histogram observed between two reads."""
    found = {}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        value = histogram_quantile(before, after, q)
        if value is not None:
            found[name] = 1000 * value
    return found


def _progress(rep: int, name: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"  rep {rep} {name:<20} failed: {result['error'][-300:]}"
    cores = result["cpu_s"]["target"] / result["elapsed_s"]
    ttft = result["ttft_ms"]
    return (
        f"  rep {rep} {name:<20} {result['requests']:>6,} streams {result['chunks_per_s']:>8,.0f} "
        f"chunks/s {cores:>5.2f} cores TTFT p50 {ttft.get('p50', math.nan):.1f} p99 "
        f"{ttft.get('p99', math.nan):.1f} ms, {result['errors']} errors"
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print the table and verdicts; write the JSON."""
    try:
        settings = _settings(args)
    except ValueError as exc:
        print(f"owngate bench seed-load: {exc}", file=sys.stderr)
        return 2

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started_at, clock = time.time(), time.monotonic()
    machine = {"cpu_count": os.cpu_count(), "loadavg_at_start": list(os.getloadavg())}
    api_key = "sk-bench-" + secrets.token_hex(16)
    rundir = args.json.parent.absolute() / "seed-load-run"
    rundir.mkdir(parents=True, exist_ok=True)
    log(
        f"seed-load benchmark: {', '.join(settings['targets'])}; {settings['rate']:g} streams/s "
        f"x {settings['tokens']} tokens, {settings['duration_s']:g}s x {settings['reps']} reps"
    )
    reps: list[dict[str, Any]] = []
    try:
        with contextlib.ExitStack() as stack:
            sims, targets = _start(stack, settings, rundir, api_key, log)
            running = [t for t in targets if t.service is not None]
            for rep in range(settings["reps"]):
                shift = rep % len(running)
                results: dict[str, Any] = {}
                for target in running[shift:] + running[:shift]:
                    assert target.service is not None
                    pids = {"target": target.service.proc.pid}
                    pids.update({sim.name: sim.proc.pid for sim in sims})
                    spec = _spec(settings, target.service.port, api_key, pids, seed=rep)
                    logged = target.name == PRODUCTION
                    before = target.service.histogram(DISPATCH_WAIT) if logged else {}
                    try:
                        result = run_in_subprocess(spec, env=child_env())
                    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                        result = {"error": str(exc)[-2000:]}
                    if logged and "error" not in result:
                        after = target.service.histogram(DISPATCH_WAIT)
                        result["dispatch_wait_ms"] = _quantiles_ms(before, after)
                    results[target.name] = result
                    log(_progress(rep + 1, target.name, result))
                reps.append(results)
            described = {t.name: t.describe() for t in targets}
    except RuntimeError as exc:
        log(f"owngate bench seed-load: {exc}")
        return 1
    report: dict[str, Any] = {
        "schema": "owngate.bench.seed-load/1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "machine": machine,
        "settings": settings,
        "targets": described,
        "reps": reps,
        "summary": summarise(reps, settings["targets"], settings),
    }
    report["wall_s"] = time.monotonic() - clock
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(f"\nwrote {args.json} ({report['wall_s']:.0f}s in all)")
    broken = any(
        "error" in result or result["errors"] for results in reps for result in results.values()
    ) or any(d.get("skipped") not in (None, NGINX_MISSING) for d in described.values())
    missed = args.check and any(v["met"] is not True for v in report["summary"]["verdicts"])
    return 1 if broken or missed else 0
