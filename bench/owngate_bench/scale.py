"""Scale benchmark: `owngate serve --workers N` for N = 1, 2, 4, side by side.

`owngate bench scale` starts a zero-latency vLLM simulator in its own process, then for
each worker count an `owngate serve --workers N` (generated config, built-in private-only
policy, no provenance), waits until every worker answers ready, and drives it with the
closed-loop load generator (`owngate_bench.loadgen`, its own process): chat at concurrency
64 and streams of 64 chunks at concurrency 64. CPU seconds of the gateway's process tree
(supervisor and workers), of the simulator, of the load generator and of the whole machine
are read around each measured window. `--reps` (3) repeats it, the worker counts
interleaved (their order turns each time); per count and load the repetition with the
median CPU per request is shown and judged.

It prints, per load, req/s and gateway CPU ms per request for each worker count with
the ratio to one worker, and where the machine's CPU went: on a machine with C cores the
gateway can use at most C minus what the simulator and the load generator take, so
req/s stops growing once the cores are full, while CPU per request (the steady figure
on a shared machine) shows the cost of a worker. The verdict per load: "flat" when the
CPU per request of every worker count is within `FLAT_WITHIN` (1.15x) of the first
count's (issue 16: `serve --workers N` costs the same per request from 1 to N). Worker
counts default to 1, 2, 4, those above the machine's cores left out (1, 2 on 2 cores).
Writes JSON; bounded to about 2 min.

Exit codes: 0 ran cleanly; 1 a run failed or returned errors; 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from gateway.tenants import hash_api_key
from owngate_bench.loadgen import LoadSpec, run_in_subprocess
from owngate_bench.services import (
    HOST,
    Service,
    child_env,
    env_flag,
    free_port,
    owngate_argv,
    readyz,
)
from owngate_bench.verdict_figures import passes, shown

__all__ = ["add_arguments", "run"]

MODEL = "bench-model"
LOADS = (("chat c=64", False, 16), ("stream c=64", True, 64))  # name, stream, max_tokens
CONCURRENCY = 64
FLAT_WITHIN = 1.15  # CPU per request of N workers over one worker's, at most


def default_workers(cpus: int | None) -> str:
    """1,2,4 without the counts above the machine's cores (never fewer than 1,2)."""
    return ",".join(str(n) for n in (1, 2, 4) if n <= max(2, cpus or 1))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, each with an OWNGATE_BENCH_* environment default."""
    parser.add_argument(
        "--workers",
        default=env_flag("WORKERS", default_workers(os.cpu_count())),
        help="comma-separated worker counts (env OWNGATE_BENCH_WORKERS; 1,2,4 up to the "
        "machine's cores: here " + default_workers(os.cpu_count()) + ")",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=env_flag("DURATION", "5"),
        help="measured seconds per load and worker count (env OWNGATE_BENCH_DURATION, 5)",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=env_flag("REPS", "3"),
        help="repetitions, worker counts interleaved in each; the run with the median CPU "
        "per request is shown (env OWNGATE_BENCH_REPS, 3)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=env_flag("SCALE_JSON", ".bench/scale.json"),
        help="where to write the results (env OWNGATE_BENCH_SCALE_JSON, .bench/scale.json)",
    )


def _config(sim_port: int, port: int, api_key: str) -> str:
    return yaml.safe_dump(
        {
            "listen": {"host": HOST, "port": port},
            "logging": {"format": "json", "level": "warning", "access_log": False},
            "backends": [
                {
                    "id": "sim",
                    "kind": "vllm",
                    "base_url": f"http://{HOST}:{sim_port}",
                    "models": [{"name": MODEL}],
                    "region": "local",
                    "owner": "bench",
                }
            ],
            "tenants": [
                {"id": "bench", "api_key_hashes": [hash_api_key(api_key)], "models": ["*"]}
            ],
            "admin": {"allow_loopback": True, "listen": None},  # /admin/status; no admin API
        }
    )


def _ready_worker(port: int) -> int | None:
    """Which worker answered /admin/status on a new connection, if it is ready to serve."""
    detail = readyz(port)
    if detail is None or detail.get("status") != "ready":
        return None
    if not detail.get("backends", {}).get("sim", {}).get("available"):
        return None
    worker = detail.get("worker")
    return int(worker) if worker is not None else 0


def _wait_all_ready(service: Service, workers: int, timeout: float = 60.0) -> None:
    """Every worker must be serving before the clock starts (the kernel spreads new
    connections over the workers, so polling on new connections reaches each)."""
    wanted = set(range(1, workers + 1)) if workers > 1 else {0}
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while seen != wanted:
        if time.monotonic() > deadline or service.proc.poll() is not None:
            raise RuntimeError(
                f"{service.name}: workers ready {sorted(seen)}: {service.log_tail()}"
            )
        worker = _ready_worker(service.port)
        if worker is not None:
            seen.add(worker)
        else:
            time.sleep(0.05)


@contextlib.contextmanager
def _simulator(rundir: Path) -> Iterator[Service]:
    port = free_port()
    argv = ["sim", "--kind", "vllm", "--zero-latency", "--host", HOST, "--port", str(port)]
    sim = Service.start("sim", owngate_argv(*argv, "--model", MODEL), child_env(), rundir, port)
    try:
        sim.wait_ready("/v1/models", {}, 30.0)
        yield sim
    finally:
        sim.stop()


def _measure(
    sim: Service, workers: int, rundir: Path, api_key: str, duration_s: float
) -> dict[str, Any]:
    port = free_port()
    config = rundir / f"owngate-{workers}.yaml"
    config.write_text(_config(sim.port, port, api_key))
    argv = owngate_argv("serve", "--config", str(config), "--workers", str(workers))
    gateway = Service.start(f"owngate-w{workers}", argv, child_env(), rundir, port)
    results: dict[str, Any] = {}
    try:
        _wait_all_ready(gateway, workers)
        for name, stream, max_tokens in LOADS:
            spec = LoadSpec(
                host=HOST,
                port=port,
                api_key=api_key,
                model=MODEL,
                stream=stream,
                concurrency=CONCURRENCY,
                max_tokens=max_tokens,
                duration_s=duration_s,
                warmup_s=0.5,
                warmup_requests=500,
                cpu_pids={"target": gateway.proc.pid, "sim": sim.proc.pid},
            )
            try:
                results[name] = run_in_subprocess(spec, env=child_env())
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                results[name] = {"error": str(exc)[-2000:]}
            print(_progress(workers, name, results[name]), file=sys.stderr, flush=True)
    finally:
        gateway.stop(timeout=30.0)
    return results


def _progress(workers: int, load: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"  workers={workers} {load}: failed: {result['error'][-300:]}"
    cpu = _cpu_ms_per_request(result)
    return (
        f"  workers={workers} {load}: {result['req_per_s']:,.0f} req/s, "
        f"gateway {cpu:.3f} ms CPU/request, {result['errors']} errors"
    )


def _cpu_ms_per_request(result: dict[str, Any]) -> float:
    requests = int(result.get("requests", 0))
    return 1000 * float(result["cpu_s"]["target"]) / requests if requests else float("nan")


def _cores_used(result: dict[str, Any], what: str) -> float:
    """Cores (CPU seconds per second) the gateway, simulator, client or the rest used."""
    elapsed = float(result["elapsed_s"])
    cpu = result["cpu_s"]
    if what == "client":
        return float(result["client_cpu_s"]) / elapsed
    if what == "other":
        ours = float(cpu["target"] + cpu["sim"] + result["client_cpu_s"])
        return max(0.0, float(cpu["machine"]) - ours) / elapsed
    return float(cpu[what]) / elapsed


def _load_table(name: str, rows: dict[int, dict[str, Any]]) -> list[str]:
    counts = list(rows)
    ok = {n: r for n, r in rows.items() if "error" not in r and r.get("requests")}
    lines = [f"{name:34}" + "".join(f"{f'N={n}':>12}" for n in counts)]

    def line(label: str, value: Callable[[dict[str, Any]], float], digits: int) -> None:
        cells = "".join(
            f"{value(ok[n]):>12,.{digits}f}" if n in ok else f"{'failed':>12}" for n in counts
        )
        lines.append(f"  {label:32}{cells}")

    base = ok.get(counts[0])
    line("req/s", lambda r: float(r["req_per_s"]), 0)
    if base is not None:
        line(f"req/s ratio to N={counts[0]}", lambda r: r["req_per_s"] / base["req_per_s"], 2)
    line("gateway CPU ms/request", _cpu_ms_per_request, 3)
    if base is not None:
        first = _cpu_ms_per_request(base)
        line(f"CPU/request ratio to N={counts[0]}", lambda r: _cpu_ms_per_request(r) / first, 2)
    for label, what in (
        ("cores: gateway (all workers)", "target"),
        ("cores: simulator", "sim"),
        ("cores: load generator", "client"),
        ("cores: everything else", "other"),
    ):
        line(label, lambda r, what=what: _cores_used(r, what), 2)  # type: ignore[misc]
    line("errors", lambda r: float(r["errors"]), 0)
    return lines


def median_runs(reps: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    """Per worker count and load, the repetition's result with the median CPU per request
    (the lower middle one of an even number) among those without errors (among all when
    every one had some); a failed load only when every rep failed."""
    found: dict[str, Any] = {}
    for n in counts:
        found[str(n)] = {}
        for name, _, _ in LOADS:
            results = [rep[str(n)][name] for rep in reps if name in rep.get(str(n), {})]
            ok = [r for r in results if "error" not in r and r.get("requests")]
            clean = [r for r in ok if not r.get("errors")] or ok  # errors: no figure
            clean.sort(key=_cpu_ms_per_request)
            if clean:
                found[str(n)][name] = clean[(len(clean) - 1) // 2]
            elif results:
                found[str(n)][name] = results[0]
    return found


def flatness(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per load: CPU/request of each worker count over the first count's, and the verdict;
    not judged when a repetition of some count failed or served errors at that load (the
    median of the clean repetitions is not the median of the run)."""
    counts: list[int] = report["settings"]["workers"]
    found = []
    for name, _, _ in LOADS:
        dirty = sorted(
            {
                n
                for rep in report.get("reps") or []
                for n in counts
                if "error" in (got := rep.get(str(n), {}).get(name, {})) or got.get("errors")
            }
        )
        cpu = {}
        for n in counts:
            result = report["runs"].get(str(n), {}).get(name, {})
            # a run with errors is no figure: a failed answer costs less than one relayed
            if "error" not in result and result.get("requests") and not result.get("errors"):
                cpu[n] = _cpu_ms_per_request(result)
        base = cpu.get(counts[0])
        ratios = {str(n): cpu[n] / base for n in counts[1:] if n in cpu and base}
        worst = max(ratios.values(), default=None)
        complete = base is not None and len(ratios) == len(counts) - 1 and len(counts) > 1
        flat = worst is not None and passes(worst, "<=", FLAT_WITHIN)
        found.append(
            {
                "load": name,
                "cpu_ms_per_request": {str(n): v for n, v in cpu.items()},
                "ratio_to_first": ratios,
                "within": FLAT_WITHIN,
                "flat": flat if complete and not dirty else None,
                "why_not_measured": (
                    f"a repetition failed or served errors (N={', '.join(map(str, dirty))})"
                    if dirty
                    else None
                ),
            }
        )
    return found


def render(report: dict[str, Any]) -> str:
    counts: list[int] = report["settings"]["workers"]
    cpus = report["machine"]["cpus"]
    reps = report["settings"].get("reps", 1)
    lines = [
        f"owngate serve --workers N on {cpus} CPUs, {CONCURRENCY} connections; of {reps} "
        "interleaved repetitions, the one with the median CPU per request"
    ]
    for name, _, _ in LOADS:
        lines += ["", *_load_table(name, {n: report["runs"][str(n)].get(name, {}) for n in counts})]
    lines += [
        "",
        f"CPU per request from {counts[0]} to {counts[-1]} workers (flat: within "
        f"{FLAT_WITHIN:g}x of {counts[0]} worker{'s' if counts[0] > 1 else ''}):",
    ]
    for verdict in report.get("flatness") or flatness(report):
        word = {True: "flat", False: "not flat", None: "not measured"}[verdict["flat"]]
        figures = ", ".join(f"N={n} {ms:.3f} ms" for n, ms in verdict["cpu_ms_per_request"].items())
        ratios = ", ".join(
            f"N={n} {shown(r, 2, '<=', FLAT_WITHIN)}x" for n, r in verdict["ratio_to_first"].items()
        )
        why = f": {verdict['why_not_measured']}" if verdict.get("why_not_measured") else ""
        lines.append(f"  {verdict['load']}: {word}{why} ({figures}; {ratios or 'no ratio'})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        counts = [int(n) for n in str(args.workers).split(",") if n.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or args.duration <= 0 or args.reps < 1:
        print(
            "owngate bench scale: --workers takes counts >= 1, e.g. 1,2,4; --reps >= 1",
            file=sys.stderr,
        )
        return 2
    api_key = "sk-bench-" + secrets.token_hex(16)
    rundir = Path(args.json).parent / "scale-run"
    rundir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(
        f"scale benchmark: workers {counts}, {args.duration:g}s per load, {args.reps} reps",
        file=sys.stderr,
    )
    reps: list[dict[str, Any]] = []
    try:
        with _simulator(rundir) as sim:
            for rep in range(args.reps):  # the order turns each time: neither count always first
                order = counts if rep % 2 == 0 else counts[::-1]
                runs = {str(n): _measure(sim, n, rundir, api_key, args.duration) for n in order}
                reps.append({str(n): runs[str(n)] for n in counts})
    except RuntimeError as exc:
        print(f"owngate bench scale: {exc}", file=sys.stderr)
        return 1
    report = {
        "schema": "owngate.bench.scale/1",
        "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
        "settings": {
            "workers": counts,
            "duration_s": args.duration,
            "concurrency": CONCURRENCY,
            "reps": args.reps,
        },
        "runs": median_runs(reps, counts),
        "reps": reps,
        "wall_s": time.monotonic() - started,
    }
    report["flatness"] = flatness(report)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(f"\nwrote {args.json} ({report['wall_s']:.0f}s in all)")
    failed = any(
        "error" in result or result.get("errors")
        for runs in reps
        for results in runs.values()
        for result in results.values()
    )
    return 1 if failed else 0
