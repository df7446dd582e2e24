"""Provenance overhead: the same gateway with the signed log off and on, side by side.

`owngate bench provenance` starts two simulators: (a) zero-latency (the gateway is the
bottleneck: the worst case for the log's per-request cost) and (b) LLM-shaped (vLLM-like
prefill/decode timings, many slots: time to first token is the model's, the log adds to
it). For each it starts two owngate processes over the same simulator: `off` (no
`provenance:` section) and `on` (a log with fsync group commit, receipts, checkpoints).
Each load point (streams at concurrency 16 and 64) runs against `off` and `on` in turn,
alternating which goes first, with the load generator in its own process
(`owngate_bench.loadgen`). Reported per point: req/s, TTFT p50/p99, CPU seconds per
request of each gateway process (from /proc, steadier than req/s on a shared machine),
and the on/off ratios. The logs written by the `on` gateways are verified at the end.

`--repeat N` measures every point N times over the same processes (alternation goes on
across runs); the verdicts on the issue's targets (throughput cost <= 15 %, added TTFT
p50 <= 2 ms) take the median over the runs of each point, since one run's TTFT moves by
several ms at c=64 on a shared machine.

Bounded: about 12 cells x (duration + warm-up) x N plus start-up, 1-2 minutes by default.

Exit codes: 0 ran cleanly; 1 a load point failed or returned errors, or a log did not
verify; 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from owngate_bench.loadgen import LoadSpec, run_in_subprocess
from owngate_bench.provenance_report import on_off_ratios, progress_line, render, verdicts
from owngate_bench.services import (
    HOST,
    Service,
    child_env,
    env_flag,
    free_port,
    fresh_log_dir,
    histogram_quantile,
    owngate_argv,
)

__all__ = ["BACKENDS", "CONCURRENCY", "add_arguments", "run"]

MODEL = "bench-model"
ORIGIN = "bench.owngate/provenance"
CONCURRENCY = (16, 64)


@dataclasses.dataclass(frozen=True)
class Backend:
    """One simulated backend shape: simulator flags and the answer length asked for."""

    name: str
    sim_flags: tuple[str, ...]
    max_tokens: int
    max_tokens_spread: int = 0


_LLM = ("--slots", "256", "--prefill-tps", "8000", "--decode-tps", "60")
BACKENDS = (
    Backend("zero-latency", ("--zero-latency",), max_tokens=16),
    # vLLM-like: 8k tok/s prefill, 60 tok/s decode per sequence, 256 slots (no queueing at
    # c=64): a 32-token answer takes ~0.5 s, its first token ~17 ms after the request.
    Backend("llm-shaped", _LLM, 32),
    # The same server with answers of 16-48 tokens: without it the closed loop runs in
    # lockstep (every answer ends at the same decode step, so each wave of new requests
    # arrives at once); real answers vary, and so does the arrival of the next request.
    Backend("llm-varied", _LLM, 32, max_tokens_spread=16),
)
MODES = ("off", "on")
# What the log adds before a request may leave (group commit + fsync), as the `on`
# gateway's own histogram saw it over each load point.
DISPATCH_WAIT = "owngate_provenance_dispatch_wait_seconds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, each with an OWNGATE_BENCH_* environment default."""
    parser.add_argument(
        "--duration",
        type=float,
        default=env_flag("DURATION", "5"),
        help="measured seconds per load point and mode (env OWNGATE_BENCH_DURATION, 5)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=env_flag("JSON", ".bench/provenance.json"),
        help="where to write the results (env OWNGATE_BENCH_JSON, .bench/provenance.json)",
    )
    parser.add_argument(
        "--backends",
        default=env_flag("BACKENDS", ",".join(b.name for b in BACKENDS)),
        help=f"comma-separated, of {', '.join(b.name for b in BACKENDS)} "
        "(env OWNGATE_BENCH_BACKENDS)",
    )
    parser.add_argument(
        "--group-commit-ms",
        type=float,
        default=env_flag("GROUP_COMMIT_MS", "2"),
        help="the `on` log's group-commit window (env OWNGATE_BENCH_GROUP_COMMIT_MS, 2)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=env_flag("REPEAT", "1"),
        help="measure every point this many times; verdicts take the median "
        "(env OWNGATE_BENCH_REPEAT, 1)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        default=env_flag("QUICK", "").lower() in ("1", "true", "yes"),
        help="a very short run for smoke tests; numbers mean little (env OWNGATE_BENCH_QUICK=1)",
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    backends: tuple[Backend, ...]
    duration_s: float
    warmup_s: float
    max_requests: int | None
    json_path: Path
    group_commit_ms: float
    quick: bool
    repeat: int = 1


def _plan(args: argparse.Namespace) -> _Plan:
    names = [n.strip() for n in str(args.backends).split(",") if n.strip()]
    known = {b.name: b for b in BACKENDS}
    if not names or any(n not in known for n in names):
        raise ValueError(f"--backends takes names of {', '.join(known)}, got {args.backends!r}")
    if args.duration <= 0 or args.group_commit_ms < 0 or not 1 <= args.repeat <= 20:
        raise ValueError("--duration must be > 0, --group-commit-ms >= 0 and --repeat within 1..20")
    duration = min(args.duration, 0.4) if args.quick else min(args.duration, 15.0)
    return _Plan(
        backends=tuple(known[n] for n in names),
        duration_s=duration,
        warmup_s=0.1 if args.quick else min(1.0, max(0.2, duration / 5)),
        max_requests=300 if args.quick else None,
        json_path=args.json,
        group_commit_ms=args.group_commit_ms,
        quick=args.quick,
        repeat=args.repeat,
    )


def _config(sim_port: int, port: int, key_hash: str, provenance: str) -> str:
    return (
        f"listen: {{host: {HOST}, port: {port}}}\n"
        "logging: {format: json, level: warning, access_log: false}\n"
        "backends:\n"
        f"  - {{id: sim, kind: vllm, base_url: 'http://{HOST}:{sim_port}',\n"
        f"     models: [{{name: {MODEL}}}], region: local, owner: bench}}\n"
        "tenants:\n"
        f"  - {{id: bench, api_key_hashes: ['{key_hash}'], models: ['*']}}\n"
        "admin: {allow_loopback: true, listen: null}\n"  # reads /admin/status; no admin API
        f"{provenance}"
    )


@dataclasses.dataclass
class _Pair:
    """One backend shape: its simulator and the gateways with the log off and on."""

    backend: Backend
    sim: Service
    gateways: dict[str, Service]
    logdir: Path


@contextlib.contextmanager
def _started(plan: _Plan, rundir: Path, api_key: str) -> Iterator[list[_Pair]]:
    from gateway.provenance import write_signing_key  # the auditor's package, light

    env = child_env()
    services: list[Service] = []
    key_file = rundir / "log.key"
    key_file.unlink(missing_ok=True)
    vkey = write_signing_key(key_file, ORIGIN)
    (rundir / "log.vkey").write_text(vkey + "\n")
    key_hash = "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()
    pairs: list[_Pair] = []
    try:
        for backend in plan.backends:
            sim_port = free_port()
            argv = ["sim", "--kind", "vllm", "--host", HOST, "--port", str(sim_port)]
            argv += ["--model", MODEL, "--seed", "1", *backend.sim_flags]
            sim = Service.start(f"sim-{backend.name}", owngate_argv(*argv), env, rundir, sim_port)
            services.append(sim)
            logdir = rundir / f"log-{backend.name}"
            fresh_log_dir(logdir)  # a fresh log per run
            gateways: dict[str, Service] = {}
            for mode in MODES:
                port = free_port()
                provenance = (
                    "provenance:\n"
                    f"  dir: '{logdir}'\n  origin: {ORIGIN}/{backend.name}\n"
                    f"  signing_key_file: '{key_file}'\n"
                    f"  group_commit_ms: {plan.group_commit_ms}\n"
                    if mode == "on"
                    else ""
                )
                config = rundir / f"owngate-{backend.name}-{mode}.yaml"
                config.write_text(_config(sim_port, port, key_hash, provenance))
                name = f"owngate-{backend.name}-{mode}"
                argv = owngate_argv("serve", "--config", str(config))
                gateways[mode] = Service.start(name, argv, env, rundir, port)
                services.append(gateways[mode])
            pairs.append(_Pair(backend, sim, gateways, logdir))
        auth = {"Authorization": f"Bearer {api_key}"}
        for pair in pairs:
            pair.sim.wait_ready("/v1/models", {}, 30.0)
            for gateway in pair.gateways.values():
                gateway.wait_ready("/v1/models", auth, 30.0)
                gateway.wait_backend_available("sim", 30.0)
        yield pairs
    finally:
        for service in reversed(services):
            service.stop()


def _measure(
    plan: _Plan,
    pairs: Sequence[_Pair],
    api_key: str,
    log: Callable[[str], None],
    repeat: int = 0,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    env = child_env()
    number = repeat * len(pairs) * len(CONCURRENCY)  # alternation goes on across runs
    for pair in pairs:
        for concurrency in CONCURRENCY:
            order = MODES if number % 2 == 0 else tuple(reversed(MODES))
            number += 1
            results: dict[str, Any] = {}
            for mode in order:
                gateway = pair.gateways[mode]
                spec = LoadSpec(
                    host=HOST,
                    port=gateway.port,
                    api_key=api_key,
                    model=MODEL,
                    stream=True,
                    concurrency=concurrency,
                    max_tokens=pair.backend.max_tokens,
                    max_tokens_spread=pair.backend.max_tokens_spread,
                    duration_s=plan.duration_s,
                    warmup_s=plan.warmup_s,
                    warmup_requests=50 if plan.quick else 1000,
                    max_requests=plan.max_requests,
                    cpu_pids={"gateway": gateway.proc.pid, "sim": pair.sim.proc.pid},
                )
                before = gateway.histogram(DISPATCH_WAIT)
                try:
                    results[mode] = run_in_subprocess(spec, env=env)
                except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                    results[mode] = {"error": str(exc)[-2000:]}
                if mode == "on" and "error" not in results[mode]:
                    after = gateway.histogram(DISPATCH_WAIT)
                    results[mode]["dispatch_wait_ms"] = {
                        name: None if value is None else 1000.0 * value
                        for name, q in (("p50", 0.5), ("p99", 0.99))
                        for value in [histogram_quantile(before, after, q)]
                    }
                log(progress_line(pair.backend.name, concurrency, mode, results[mode]))
            rows.append(
                {
                    "backend": pair.backend.name,
                    "concurrency": concurrency,
                    "repeat": repeat,
                    "max_tokens": pair.backend.max_tokens,
                    "order": list(order),
                    "results": results,
                    "ratios": on_off_ratios(results),
                }
            )
    return rows


def _verify_logs(pairs: Sequence[_Pair], rundir: Path) -> dict[str, str]:
    from gateway.provenance import ProvenanceError, load_verifiers, verify_log

    keys = load_verifiers([(rundir / "log.vkey").read_text().strip()])
    found: dict[str, str] = {}
    for pair in pairs:
        try:
            summary = verify_log(pair.logdir, keys)
        except ProvenanceError as exc:
            found[pair.backend.name] = f"FAILED: {exc}"
            continue
        found[pair.backend.name] = (
            f"verified, {summary.size} entries, {summary.checkpoints} checkpoints"
        )
    return found


def run(args: argparse.Namespace) -> int:
    """Run the benchmark with parsed arguments; print the table and write the JSON."""
    try:
        plan = _plan(args)
    except ValueError as exc:
        print(f"owngate bench provenance: {exc}", file=sys.stderr)
        return 2

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started_at, clock = time.time(), time.monotonic()
    api_key = "sk-bench-" + secrets.token_hex(16)
    rundir = plan.json_path.parent.absolute() / "provenance-run"
    rundir.mkdir(parents=True, exist_ok=True)
    names = ", ".join(b.name for b in plan.backends)
    log(f"provenance benchmark: off vs on over {names}; {plan.duration_s:g}s per point")
    try:
        with _started(plan, rundir, api_key) as pairs:
            rows = [
                row
                for repeat in range(plan.repeat)
                for row in _measure(plan, pairs, api_key, log, repeat)
            ]
    except RuntimeError as exc:
        log(f"owngate bench provenance: {exc}")
        return 1
    logs = _verify_logs(pairs, rundir)
    report: dict[str, Any] = {
        "schema": "owngate.bench.provenance/1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "wall_s": time.monotonic() - clock,
        "machine": {"cpu_count": os.cpu_count(), "loadavg_at_start": list(os.getloadavg())},
        "settings": {
            "backends": [dataclasses.asdict(b) for b in plan.backends],
            "concurrency": list(CONCURRENCY),
            "duration_s": plan.duration_s,
            "warmup_s": plan.warmup_s,
            "max_requests": plan.max_requests,
            "group_commit_ms": plan.group_commit_ms,
            "quick": plan.quick,
            "repeat": plan.repeat,
            "stream": True,
        },
        "points": rows,
        "verdicts": verdicts(rows),
        "logs": logs,
    }
    plan.json_path.parent.mkdir(parents=True, exist_ok=True)
    plan.json_path.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(f"\nwrote {plan.json_path} ({report['wall_s']:.0f}s in all)")
    broken = any(
        "error" in result or result["errors"] for row in rows for result in row["results"].values()
    ) or any(text.startswith("FAILED") for text in logs.values())
    return 1 if broken else 0
