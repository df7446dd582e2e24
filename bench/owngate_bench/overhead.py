"""Overhead benchmark: the same load, side by side, to the simulator, owngate and LiteLLM.

`owngate bench overhead` starts a zero-latency vLLM simulator, owngate (one worker,
generated config, the built-in private-only policy set), owngate+policy (the same with a
generated trust-policy directory and more backends, see `owngate_bench.overhead_policy`),
owngate+tracing (plain owngate with OpenTelemetry tracing on, exporting to a loopback
sink, see `owngate_bench.overhead_tracing`) and LiteLLM's proxy (pinned release in its
own virtualenv, one worker, no database) as separate processes, then runs each load
point against each target in turn with a load generator in yet another process
(`owngate_bench.loadgen`). Loads: chat at concurrency 1/16/64 (req/s, latency), streams of
64 chunks at concurrency 16/64 (chunks/s, TTFT). CPU seconds of each server's process
tree are read from /proc around every measured window: steadier than req/s on a shared
machine. Once the servers are stopped, it times the policy
decisions (cached and uncached) of both owngate configs. It prints a table with ratios and
the issue's targets with their margins, and writes JSON.

Exit codes: 0 ran cleanly; 1 a target failed or returned errors (or, with `--check`, a
target was missed); 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway import __version__
from owngate_bench import litellm_proxy
from owngate_bench.loadgen import LoadSpec, run_in_subprocess
from owngate_bench.overhead_policy import HOSTED_KEY_ENV, decision_cost, write_policy_config
from owngate_bench.overhead_report import evaluate_checks, policy_comparison, render
from owngate_bench.overhead_tracing import (
    TRACED,
    TraceSink,
    on_off_comparison,
    render_on_off,
    render_tracing,
    tracing_comparison,
)
from owngate_bench.services import HOST, Service, child_env, env_flag, free_port, owngate_argv

__all__ = ["POINTS", "TARGETS", "Point", "add_arguments", "run"]


@dataclasses.dataclass(frozen=True)
class Point:
    """One load: chat requests or streams, at a fixed number of connections."""

    name: str
    stream: bool
    concurrency: int

    @property
    def max_tokens(self) -> int:
        return 64 if self.stream else 16  # the simulator sends one chunk per token


ACCESS_LOGGED = "owngate+accesslog"
"""Plain owngate's config with its JSON access log written (`level: info`)."""
TARGETS = ("direct", "owngate", "owngate+policy", TRACED, ACCESS_LOGGED, "litellm")
OWNGATE_TARGETS = ("owngate", "owngate+policy")
POINTS = (
    Point("chat c=1", stream=False, concurrency=1),
    Point("chat c=16", stream=False, concurrency=16),
    Point("chat c=64", stream=False, concurrency=64),
    Point("stream c=16", stream=True, concurrency=16),
    Point("stream c=64", stream=True, concurrency=64),
)
MODEL = "bench-model"


def _flag(name: str) -> bool:
    return env_flag(name, "").strip().lower() in {"1", "true", "yes", "on"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, each with an OWNGATE_BENCH_* environment default."""
    parser.add_argument(
        "--duration",
        type=float,
        default=env_flag("DURATION", "5"),
        help="measured seconds per load point and target (env OWNGATE_BENCH_DURATION, 5)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=env_flag("REQUESTS", "0"),
        help="cap on measured requests per point, 0 = none (env OWNGATE_BENCH_REQUESTS)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=env_flag("JSON", ".bench/overhead.json"),
        help="where to write the results (env OWNGATE_BENCH_JSON, .bench/overhead.json)",
    )
    parser.add_argument(
        "--targets",
        default=env_flag("TARGETS", ",".join(TARGETS)),
        help=f"comma-separated targets to run, of {', '.join(TARGETS)} (env OWNGATE_BENCH_TARGETS)",
    )
    parser.add_argument(
        "--skip-litellm",
        action="store_true",
        default=_flag("SKIP_LITELLM"),
        help="leave LiteLLM out (env OWNGATE_BENCH_SKIP_LITELLM=1)",
    )
    parser.add_argument(
        "--litellm-version",
        default=env_flag("LITELLM_VERSION", litellm_proxy.DEFAULT_VERSION),
        help=f"pinned litellm[proxy] release (env OWNGATE_BENCH_LITELLM_VERSION, "
        f"{litellm_proxy.DEFAULT_VERSION})",
    )
    parser.add_argument(
        "--litellm-venv",
        type=Path,
        default=env_flag("LITELLM_VENV", ".bench/litellm-venv"),
        help="virtualenv for LiteLLM, made on first use (env OWNGATE_BENCH_LITELLM_VENV)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        default=_flag("QUICK"),
        help="a very short run for CI smoke tests, numbers mean little (env OWNGATE_BENCH_QUICK=1)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        default=_flag("CHECK"),
        help="exit 1 when a performance target is missed (env OWNGATE_BENCH_CHECK=1)",
    )
    parser.add_argument(
        "--policy-calls",
        type=int,
        default=env_flag("POLICY_CALLS", "0"),
        help="timed policy decisions per mode, 0 = 200,000 (20,000 with --quick) "
        "(env OWNGATE_BENCH_POLICY_CALLS)",
    )


def _key_hash(api_key: str) -> str:
    return "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()


def _owngate_config(sim_port: int, port: int, api_key: str, level: str = "warning") -> str:
    """Plain owngate; at `level: warning` its access lines (info) are not written."""
    key_hash = _key_hash(api_key)
    return (
        f"listen: {{host: {HOST}, port: {port}}}\n"
        f"logging: {{format: json, level: {level}}}\n"
        "backends:\n"
        f"  - {{id: sim, kind: vllm, base_url: 'http://{HOST}:{sim_port}',\n"
        f"     models: [{{name: {MODEL}}}], region: local, owner: bench}}\n"
        "tenants:\n"
        f"  - {{id: bench, api_key_hashes: ['{key_hash}'], models: ['*']}}\n"
        "admin: {allow_loopback: true, listen: null}\n"  # reads /admin/status; no admin API
    )


@dataclasses.dataclass
class _Plan:
    """Resolved options of one run."""

    targets: tuple[str, ...]
    duration_s: float
    warmup_s: float
    max_requests: int | None
    json_path: Path
    litellm_version: str
    litellm_venv: Path
    check: bool
    quick: bool
    policy_calls: int


def _plan(args: argparse.Namespace) -> _Plan:
    targets = tuple(t.strip() for t in str(args.targets).split(",") if t.strip())
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        raise ValueError(f"--targets takes names of {', '.join(TARGETS)}, got {args.targets!r}")
    if args.skip_litellm:
        targets = tuple(t for t in targets if t != "litellm")
    if args.duration <= 0 or args.requests < 0 or args.policy_calls < 0:
        raise ValueError("--duration must be > 0, --requests and --policy-calls >= 0")
    duration = min(args.duration, 0.4) if args.quick else args.duration
    return _Plan(
        targets=tuple(t for t in TARGETS if t in targets),
        duration_s=duration,
        warmup_s=0.1 if args.quick else min(1.0, max(0.2, duration / 5)),
        max_requests=(args.requests or 300) if args.quick else (args.requests or None),
        json_path=args.json,
        litellm_version=args.litellm_version,
        litellm_venv=args.litellm_venv,
        check=args.check,
        quick=args.quick,
        policy_calls=args.policy_calls or (20_000 if args.quick else 200_000),
    )


@dataclasses.dataclass
class _Target:
    """A target of the run: its server (shared with the simulator for `direct`) or why not."""

    name: str
    service: Service | None = None
    error: str | None = None
    config: Path | None = None  # owngate's generated gateway.yaml
    policy: dict[str, Any] | None = None  # the policy set owngate says it enforces

    def describe(self) -> dict[str, Any]:
        if self.service is None:
            return {"error": self.error}
        found: dict[str, Any] = {"url": self.service.url, "pid": self.service.proc.pid}
        if self.config is not None:
            found["config"] = str(self.config)
        if self.policy is not None:
            found["policy"] = self.policy
        return found


def _server_policy(service: Service) -> dict[str, Any] | None:
    """The policy set a running owngate reports in its readiness detail (id, version, digest,
    builtin)."""
    detail = service.readyz()
    policy = detail.get("policy") if detail is not None else None
    if not isinstance(policy, dict):
        return None
    return {k: policy[k] for k in ("id", "version", "digest", "builtin") if k in policy}


@contextlib.contextmanager
def _started(
    plan: _Plan, rundir: Path, api_key: str, log: Callable[[str], None], sink: TraceSink
) -> Iterator[tuple[Service, list[_Target]]]:
    """Start the simulator and the targets side by side; stop them all on the way out.
    Only owngate+tracing traces (to `sink`): OTEL_* variables of ours are not passed on."""
    targets = [_Target(name) for name in plan.targets]
    litellm_exe: Path | None = None
    if "litellm" in plan.targets:  # install first: the servers would only idle meanwhile
        try:
            litellm_exe = litellm_proxy.ensure_venv(plan.litellm_venv, plan.litellm_version, log)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            next(t for t in targets if t.name == "litellm").error = f"no LiteLLM: {exc}"
    env = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    services: list[Service] = []
    try:
        sim_port = free_port()
        sim_argv = ["sim", "--kind", "vllm", "--zero-latency", "--host", HOST]
        sim_argv += ["--port", str(sim_port), "--model", MODEL, "--seed", "1"]
        sim = Service.start("sim", owngate_argv(*sim_argv), env, rundir, sim_port)
        services.append(sim)
        ready: dict[str, tuple[str, dict[str, str], float]] = {"sim": ("/v1/models", {}, 30.0)}
        for target in targets:
            if target.name == "direct":
                target.service = sim
            elif target.name in (TRACED, ACCESS_LOGGED):  # plain owngate's config, one more
                port = free_port()  # feature on: tracing, or the access log (to a file)
                traced = target.name == TRACED
                config = rundir / ("owngate-tracing.yaml" if traced else "owngate-accesslog.yaml")
                level = "warning" if traced else "info"
                config.write_text(_owngate_config(sim_port, port, api_key, level))
                argv = owngate_argv("serve", "--config", str(config))
                traced_env = {**env, **sink.environment()} if traced else env
                target.service = Service.start(target.name, argv, traced_env, rundir, port)
                target.config = config
                ready[target.name] = ("/v1/models", {"Authorization": f"Bearer {api_key}"}, 30.0)
            elif target.name in OWNGATE_TARGETS:
                port = free_port()
                gateway_env = env
                if target.name == "owngate":
                    config = rundir / "owngate.yaml"
                    config.write_text(_owngate_config(sim_port, port, api_key))
                else:  # the hosted fallback needs its key set, though it is never called
                    config = write_policy_config(
                        rundir,
                        host=HOST,
                        port=port,
                        sim_port=sim_port,
                        closed_port=free_port(),
                        model=MODEL,
                        key_hash=_key_hash(api_key),
                    )
                    gateway_env = {**env, HOSTED_KEY_ENV: "sk-bench-hosted-" + secrets.token_hex(8)}
                target.config = config
                argv = owngate_argv("serve", "--config", str(config))
                target.service = Service.start(target.name, argv, gateway_env, rundir, port)
                auth = {"Authorization": f"Bearer {api_key}"}
                ready[target.name] = ("/v1/models", auth, 30.0)
            elif litellm_exe is not None:
                proxy = litellm_proxy.LiteLLMProxy(
                    litellm_exe, rundir, sim.url, MODEL, api_key, HOST, free_port()
                )
                argv, proxy_env = proxy.command(), proxy.environment(env)
                target.service = Service.start("litellm", argv, proxy_env, rundir, proxy.port)
                ready["litellm"] = (proxy.ready_path, {}, 120.0)  # its import alone takes ~8 s
            if target.service is not None and target.service is not sim:
                services.append(target.service)
        for service in services:
            path, headers, timeout = ready[service.name]
            try:
                service.wait_ready(path, headers, timeout)
            except RuntimeError as exc:
                if service is sim:
                    raise RuntimeError(f"the simulator did not start: {exc}") from exc
                for target in targets:
                    if target.service is service:
                        target.service, target.error = None, str(exc)
        for target in targets:
            if target.config is not None and target.service is not None:
                target.service.wait_backend_available("sim", 30.0)
                target.policy = _server_policy(target.service)
        yield sim, targets
    finally:
        for service in reversed(services):
            service.stop()


def _measure(
    plan: _Plan, sim: Service, targets: list[_Target], api_key: str, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Each load point against each running target in turn; one result dict per cell.

    owngate and owngate+policy swap places from one point to the next, so that neither
    is always measured second (on a busy machine the order alone moves req/s by ~5%).
    """
    rows: list[dict[str, Any]] = []
    python_env = child_env()
    for index, point in enumerate(POINTS):
        results: dict[str, Any] = {}
        for target in _in_order(targets, swap=index % 2 == 1):
            service = target.service
            if service is None:
                continue
            cpu_pids = {"target": service.proc.pid}
            if service is not sim:
                cpu_pids["sim"] = sim.proc.pid
            spec = LoadSpec(
                host=HOST,
                port=service.port,
                api_key=api_key,
                model=MODEL,
                stream=point.stream,
                concurrency=point.concurrency,
                max_tokens=point.max_tokens,
                duration_s=plan.duration_s,
                warmup_s=plan.warmup_s,
                warmup_requests=50 if plan.quick else 2000,
                max_requests=plan.max_requests,
                cpu_pids=cpu_pids,
            )
            try:
                result = run_in_subprocess(spec, env=python_env)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                result = {"error": str(exc)[-2000:]}
            results[target.name] = result
            log(_progress(point, target.name, result))
        rows.append(
            {
                **dataclasses.asdict(point),
                "max_tokens": point.max_tokens,
                "order": list(results),
                "results": results,
            }
        )
    return rows


def _in_order(targets: Sequence[_Target], swap: bool) -> list[_Target]:
    """`targets`, with owngate and owngate+policy trading places when `swap` is true."""
    ordered = list(targets)
    places = [i for i, t in enumerate(ordered) if t.name in OWNGATE_TARGETS]
    if swap and len(places) == 2:
        first, second = places
        ordered[first], ordered[second] = ordered[second], ordered[first]
    return ordered


def _progress(point: Point, name: str, result: Mapping[str, Any]) -> str:
    if "error" in result:
        return f"  {point.name:<12} {name:<14} failed: {result['error'][:300]}"
    rate = f" {result['chunks_per_s']:>9,.0f} chunks/s" if point.stream else ""
    errors = f", {result['errors']} errors" if result["errors"] else ""
    return (
        f"  {point.name:<12} {name:<14} {result['requests']:>7,} req "
        f"{result['req_per_s']:>9,.0f} req/s{rate}{errors}"
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
        plan = _plan(args)
    except ValueError as exc:
        print(f"owngate bench overhead: {exc}", file=sys.stderr)
        return 2
    started_at = time.time()
    clock = time.monotonic()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    api_key = "sk-bench-" + secrets.token_hex(16)
    rundir = plan.json_path.parent / "overhead-run"
    rundir.mkdir(parents=True, exist_ok=True)
    machine = _machine()
    log(f"overhead benchmark: {', '.join(plan.targets)}; {plan.duration_s:g}s per point")
    try:
        # The sink outlives the gateways: their spans are flushed as they stop.
        with TraceSink(HOST) as sink, _started(plan, rundir, api_key, log, sink) as running:
            rows = _measure(plan, *running, api_key, log)
        targets = running[1]
    except RuntimeError as exc:
        log(f"owngate bench overhead: {exc}")
        return 1
    decisions = _decisions(plan, targets, log)  # the servers are stopped: a quiet machine
    checks = evaluate_checks(rows, decisions)
    tracing = tracing_comparison(rows)
    access = on_off_comparison(rows, ACCESS_LOGGED)
    sink_counts = {"exports": sink.exports, "bytes": sink.bytes}
    versions = {"owngate": __version__, "litellm": None}
    if "litellm" in plan.targets:
        versions["litellm"] = litellm_proxy.installed_version(plan.litellm_venv)
    report = {
        "schema": "owngate.bench.overhead/1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "wall_s": time.monotonic() - clock,
        "machine": machine,
        "versions": versions,
        "settings": {
            "targets": list(plan.targets),
            "duration_s": plan.duration_s,
            "warmup_s": plan.warmup_s,
            "max_requests": plan.max_requests,
            "quick": plan.quick,
            "gateway_workers": 1,
            "litellm_workers": 1,
            "policy_calls": plan.policy_calls,
        },
        "targets": {target.name: target.describe() for target in targets},
        "points": rows,
        "policy": {
            "decisions": decisions,
            "vs_owngate": policy_comparison(rows),
        },
        "checks": checks,
        "tracing": {"vs_owngate": tracing, "sink": sink_counts},
        "access_log": {"vs_owngate": access},
    }
    plan.json_path.parent.mkdir(parents=True, exist_ok=True)
    plan.json_path.write_text(json.dumps(report, indent=2) + "\n")
    access_heading = (
        "access log on vs off (owngate+accesslog ÷ owngate; one JSON line per request, "
        "written to a file)"
    )
    tables = [*render_tracing(tracing, sink_counts), *render_on_off(access, access_heading)]
    print("\n".join([render(report), *tables]))
    print(f"\nwrote {plan.json_path} ({report['wall_s']:.0f}s in all)")
    return _exit_code(report, plan.check)


def _decisions(
    plan: _Plan, targets: Sequence[_Target], log: Callable[[str], None]
) -> dict[str, Any]:
    """Per owngate target that started: its policy set and the cost of its decisions."""
    from gateway.config import ConfigError
    from gateway.policy import PolicyError

    found: dict[str, Any] = {}
    for target in targets:
        if (
            target.config is None
            or target.service is None
            or target.name in (TRACED, ACCESS_LOGGED)
        ):
            continue  # owngate+tracing and owngate+accesslog decide as owngate does
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
    decisions = report.get("policy", {}).get("decisions", {})
    broken = (
        any("error" in entry for entry in report["targets"].values())
        or any(
            "error" in result or result["errors"]
            for row in report["points"]
            for result in row["results"].values()
        )
        or any("error" in cost or cost["refused_keys"] for cost in decisions.values())
    )
    missed = check and any(c["passed"] is False for c in report["checks"])
    return 1 if broken or missed else 0
