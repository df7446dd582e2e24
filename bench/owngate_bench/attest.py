"""What the `owngate attest` sidecar costs: the same requests direct, via a sidecar, via a
gateway, and via a gateway and a sidecar, side by side.

`owngate bench attest` starts one zero-latency simulator (so the sidecar's and gateway's
own work is what the latency shows) or, with `--backend real`, a real llama.cpp
`llama-server` with the tiny test model (`--real-dir`, default `$OWNGATE_REAL_BACKEND_DIR`
or `.real-backend/`, as `tests/helpers/real_backend/setup.sh` installs it; answers of
REAL_MAX_TOKENS tokens). In front of it: two sidecars (one taking requests directly, one
behind a gateway: each sidecar's log then holds exactly one party's traffic) and two
gateways with the provenance log on: `gateway` to the backend, `gateway+sidecar` to the
second sidecar, attested. Each target gets the same closed-loop load (whole answers,
concurrency 1 by default: latency, not throughput), in turn, with the load generator in
its own process; `--reps` (3) repetitions, the order of the targets rotated each time.
Reported, as medians of the repetitions: p50/p99 latency per target, the p50 the sidecar
adds (via sidecar - direct; gateway+sidecar - gateway, taken within each repetition) and
the sidecar's CPU per request (from /proc). The issue's targets: <= 0.3 ms p50 added,
<= 100 µs CPU per request. At the end the gateway's log is audited against the
sidecar's (`owngate audit verify --backend-key --attest-log`). On a shared machine the
figures move; the command prints how busy the machine was.

Exit codes: 0 ran cleanly (targets are reported, not enforced); 1 a load point failed or
the audit did not pass; 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from owngate_bench import attest_instructions
from owngate_bench.attest_report import figures, render
from owngate_bench.loadgen import LoadSpec, run_in_subprocess
from owngate_bench.overhead_points import rotated
from owngate_bench.services import (
    HOST,
    Service,
    child_env,
    free_port,
    machine_busy_seconds,
    owngate_argv,
)

__all__ = ["TARGETS", "add_arguments", "run"]

MODEL = "bench-model"
ORIGIN = "bench.owngate/attest"
# Every process stays in the benchmark's session (its own process group still): where the
# kernel schedules by session (Linux autogroup) and other sessions keep the CPUs busy,
# each hop between processes in different sessions waited milliseconds for its group's
# turn, which measured the scheduler rather than the sidecar (+0.7-1.0 ms p50 via sidecar
# in separate sessions, +0.2-0.3 ms in one, the same build, same hour).
_SESSION = {"own_session": False}
REAL_MAX_TOKENS = 4  # a real server's answers: short, so the run measures the relay
TARGETS = ("direct", "sidecar", "gateway", "gateway+sidecar")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per target (5)")
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        help="interleaved repetitions, the order of the targets rotated each time; figures "
        "are their medians (3; 1 with --quick)",
    )
    parser.add_argument("--concurrency", type=int, default=1, help="clients at once (1)")
    parser.add_argument("--stream", action="store_true", help="streamed answers instead")
    parser.add_argument("--quick", action="store_true", help="a short run, for smoke tests")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--backend",
        choices=("sim", "real"),
        default="sim",
        help="behind the sidecars: the zero-latency simulator (sim) or a real llama-server "
        "with the tiny test model (real)",
    )
    parser.add_argument(
        "--real-dir",
        type=Path,
        default=None,
        help="where setup.sh installed llama-server (default: $OWNGATE_REAL_BACKEND_DIR, "
        "else .real-backend)",
    )
    attest_instructions.add_arguments(parser)  # --instructions, a run of its own


def _real_dir(args: argparse.Namespace) -> Path:
    if args.real_dir is not None:
        return Path(args.real_dir)
    return Path(os.environ.get("OWNGATE_REAL_BACKEND_DIR") or ".real-backend")


def _backend(rundir: Path, args: argparse.Namespace, env: dict[str, str]) -> Service:
    """The server behind everything: the zero-latency simulator, or llama-server."""
    port = free_port()
    if args.backend == "sim":
        argv = owngate_argv("sim", "--host", HOST, "--port", str(port), "--model", MODEL)
        return Service.start("sim", [*argv, "--zero-latency"], env, rundir, port, **_SESSION)
    root = _real_dir(args)
    binary = root / "bin" / "llama-server"
    # The prebuilt finds its libraries beside the real file, not beside a link to it.
    libs = str(binary.resolve().parent)
    env = {
        **env,
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, (libs, env.get("LD_LIBRARY_PATH")))),
    }
    argv = [
        str(binary),
        *("--model", str(root / "models" / "tiny" / "tiny-llama.gguf"), "--alias", MODEL),
        *("--host", HOST, "--port", str(port), "--parallel", str(max(1, args.concurrency))),
        *("--ctx-size", str(512 * max(1, args.concurrency)), "--threads", "1"),
        *("--device", "none", "--no-webui"),
    ]
    return Service.start("llama-server", argv, env, rundir, port, **_SESSION)


def _gateway_config(port: int, backend_url: str, key_hash: str, rundir: Path, name: str) -> str:
    attest = ""
    if name == "gateway+sidecar":
        vkey = (rundir / "sidecar-gw.vkey").read_text().strip()
        attest = f", attest: {{key: '{vkey}'}}"
    return (
        f"listen: {{host: {HOST}, port: {port}}}\n"
        "logging: {format: json, level: warning, access_log: false}\n"
        "backends:\n"
        f"  - {{id: sim, kind: vllm, base_url: '{backend_url}',\n"
        f"     models: [{{name: {MODEL}}}], region: local, owner: bench{attest}}}\n"
        "tenants:\n"
        f"  - {{id: bench, api_key_hashes: ['{key_hash}'], models: ['*']}}\n"
        "admin: {allow_loopback: true, listen: null}\n"
        "provenance:\n"
        f"  dir: '{rundir / ('log-' + name.replace('+', '-'))}'\n"
        f"  origin: {ORIGIN}/{name.replace('+', '-')}\n"
        f"  signing_key_file: '{rundir / 'log.key'}'\n"
    )


@contextlib.contextmanager
def _started(rundir: Path, api_key: str, args: argparse.Namespace) -> Iterator[dict[str, Service]]:
    """The backend, the two sidecars and the two gateways, ready; stopped at the end."""
    from gateway.provenance import write_signing_key  # the auditor's package, light

    env = child_env()
    services: dict[str, Service] = {}
    write_signing_key(rundir / "log.key", ORIGIN)
    key_hash = "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()
    try:
        sim = services["direct"] = _backend(rundir, args, env)
        for name in ("sidecar", "sidecar-gw"):
            vkey = write_signing_key(rundir / f"{name}.key", name)
            (rundir / f"{name}.vkey").write_text(vkey + "\n")
            port = free_port()
            argv = ["attest", "--listen", f"{HOST}:{port}", "--backend", sim.url]
            argv += ["--key", str(rundir / f"{name}.key"), "--log", str(rundir / f"{name}-log")]
            services[name] = Service.start(name, owngate_argv(*argv), env, rundir, port, **_SESSION)
        for name, upstream in (("gateway", sim), ("gateway+sidecar", services["sidecar-gw"])):
            port = free_port()
            config = rundir / f"{name.replace('+', '-')}.yaml"
            config.write_text(_gateway_config(port, upstream.url, key_hash, rundir, name))
            argv = owngate_argv("serve", "--config", str(config))
            services[name] = Service.start(name, argv, env, rundir, port, **_SESSION)
        auth = {"Authorization": f"Bearer {api_key}"}
        for name, service in services.items():
            service.wait_ready("/v1/models", auth if name.startswith("gateway") else {}, 60.0)
            if name.startswith("gateway"):
                service.wait_backend_available("sim", 30.0)
        yield services
    finally:
        for service in reversed(services.values()):
            service.stop()


def _measure(
    services: Mapping[str, Service], api_key: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """`_reps(args)` repetitions, each every target in turn, in an order rotated from one
    repetition to the next (no target always first)."""
    return [
        {t: _measure_one(services, api_key, args, t) for t in rotated(list(TARGETS), rep)}
        for rep in range(_reps(args))
    ]


def _reps(args: argparse.Namespace) -> int:
    """--reps, else 3 (1 with --quick)."""
    return int(args.reps) if args.reps is not None else (1 if args.quick else 3)


def _measure_one(
    services: Mapping[str, Service], api_key: str, args: argparse.Namespace, target: str
) -> dict[str, Any]:
    duration = 1.0 if args.quick else args.duration
    service = services[target]
    pids = {"target": service.proc.pid}
    if target == "sidecar":
        pids["sidecar"] = service.proc.pid
    if target == "gateway+sidecar":
        pids["sidecar"] = services["sidecar-gw"].proc.pid
    spec = LoadSpec(
        host=HOST,
        port=service.port,
        api_key=api_key,
        model=MODEL,
        stream=args.stream,
        concurrency=args.concurrency,
        duration_s=duration,
        warmup_s=0.2 if args.quick else 1.0,
        warmup_requests=50 if args.quick else 500,
        cpu_pids=pids,
        max_tokens=REAL_MAX_TOKENS if args.backend == "real" else LoadSpec.max_tokens,
    )
    try:
        return run_in_subprocess(spec, env=child_env())
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)[-2000:]}


def _audit(rundir: Path) -> str | None:
    """`owngate audit verify` of the attested gateway's log against its sidecar's log;
    None when it passes, else what it said."""
    from gateway.provenance import load_signer

    argv = owngate_argv(
        "audit",
        "verify",
        str(rundir / "log-gateway-sidecar"),
        "--key",
        load_signer(rundir / "log.key").vkey,
        "--backend-key",
        "sim=" + (rundir / "sidecar-gw.vkey").read_text().strip(),
        "--attest-log",
        str(rundir / "sidecar-gw-log"),
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    return None if done.returncode == 0 else (done.stderr or done.stdout)[-2000:]


def run(args: argparse.Namespace) -> int:
    if args.instructions:
        return attest_instructions.run(args)
    if args.concurrency < 1 or args.duration <= 0 or _reps(args) < 1:
        print(
            "owngate bench attest: --concurrency >= 1, --duration > 0 and --reps >= 1",
            file=sys.stderr,
        )
        return 2
    if args.backend == "real" and not (_real_dir(args) / "bin" / "llama-server").exists():
        print(
            f"owngate bench attest: no llama-server in {_real_dir(args)}/bin (install it with "
            "tests/helpers/real_backend/setup.sh, or pass --real-dir)",
            file=sys.stderr,
        )
        return 2
    api_key = "sk-bench-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="owngate-bench-attest-") as tmp:
        rundir = Path(tmp)
        with _started(rundir, api_key, args) as services:
            busy, started = machine_busy_seconds(), time.monotonic()
            results = _measure(services, api_key, args)
            busy = (machine_busy_seconds() - busy) / max(time.monotonic() - started, 1e-9)
        audit = _audit(rundir)
    report = {
        "concurrency": args.concurrency,
        "stream": args.stream,
        "backend": args.backend,
        "backend_name": "zero-latency simulator"
        if args.backend == "sim"
        else f"llama-server (tiny model, {REAL_MAX_TOKENS} tokens)",
        "machine_busy": busy / max(_cores(), 1),
        **figures(results),
        "audit": audit,
    }
    print(json.dumps(report) if args.json else render(report))
    failed = audit is not None or any(
        row is None or row["errors"] for row in report["targets"].values()
    )
    return 1 if failed else 0


def _cores() -> int:
    return os.cpu_count() or 1
