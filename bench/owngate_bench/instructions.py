"""Instructions per request: owngate plain vs production, counted by callgrind.

On a shared machine the wall-clock benchmarks move by 2x between runs and even CPU per
request drifts with cache and scheduler contention. `valgrind --tool=callgrind` counts
the instructions a process executes, which does not depend on what else runs beside it
(repeatable to about 1 % here, with another core busy). `owngate bench instructions`
starts two zero-latency simulators and, in turn, the plain and the production
configuration of `owngate bench overhead` (`owngate_bench.overhead_production`: policy
set, provenance log with receipts, score routing over two backends, the JSON access log)
under callgrind, warms each up, zeroes the counters (`callgrind_control -z`), sends
`--requests` requests at `--concurrency`, dumps (`callgrind_control -d`) and reads the
total: instructions per request, per thread group, and per relayed chunk with `--stream`.

What it cannot show: time spent waiting (fsync, the GIL, the network), and SHA-256 is
over-counted (valgrind hides the CPU's SHA extensions from OpenSSL, which then takes its
generic code). The gateway's periodic work (metric scrapes, config reload checks, the
admin timeline sampler) runs on timers, so it is stretched out here to keep a slowed-down
run from charging it to requests. Expect a run to take a minute or two per target.

Exit codes: 0 ran; 1 a target failed; 2 usage or valgrind missing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from owngate_bench.overhead_production import write_production_config
from owngate_bench.overhead_targets import key_hash
from owngate_bench.services import HOST, Service, child_env, free_port, owngate_argv

__all__ = ["TARGETS", "add_arguments", "count_calls", "count_total", "run"]

MODEL = "bench-model"
TARGETS = ("owngate", "owngate+production")
# Timers stretched so that a run 30-50x slower than native does not charge them to requests.
_QUIET = (
    "scrape: {interval_s: 30, staleness_s: 3600, timeout_s: 5}\n"
    "admin: {allow_loopback: true, listen: null, sample_interval_s: 60}\n"
)
_TOTALS = re.compile(r"^\s*([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", re.M)
_NAMED = re.compile(r"^c?fn=\((\d+)\)(?: (.*))?$")
# libuv's read of a socket: one per read the gateway took from a backend or a client
_READ = "uv__read"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=300, help="measured requests (300)")
    parser.add_argument("--concurrency", type=int, default=1, help="clients at once (1)")
    parser.add_argument("--stream", action="store_true", help="streams of --tokens chunks")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer (16)")
    parser.add_argument(
        "--prompt-kb", type=float, default=1.0, help="size of the request's prompt in KB (1)"
    )
    parser.add_argument(
        "--token-interval",
        type=float,
        default=0.0,
        help="pace the simulators' streams: one write per token, this many seconds apart "
        "(0: back to back, as fast as they go; 0.02 as a decoding server writes them)",
    )
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--keep-dumps",
        type=Path,
        default=None,
        help="copy each target's callgrind dump of the measured requests into this folder "
        "(for callgrind_annotate)",
    )


def count_total(annotated: str) -> int:
    """The PROGRAM TOTALS line of `callgrind_annotate` output (ValueError if missing)."""
    found = _TOTALS.search(annotated)
    if found is None:
        raise ValueError("callgrind_annotate printed no PROGRAM TOTALS")
    return int(found.group(1).replace(",", ""))


def count_calls(dump: str, function: str) -> int:
    """How many calls of `function` a callgrind dump (the raw file) records. With
    `--stream`, the calls of libuv's `uv__read` tell how many reads the chunks came in: a
    process slowed 30-50x may fall behind a paced stream and find several tokens in one
    read, which makes a chunk look cheaper (check reads per chunk before comparing)."""
    names: dict[str, str] = {}
    total, callee = 0, None
    for line in dump.splitlines():
        if line.startswith(("fn=", "cfn=")):
            found = _NAMED.match(line)
            if found is not None:
                if found.group(2) is not None:
                    names[found.group(1)] = found.group(2)
                if line.startswith("cfn="):
                    callee = names.get(found.group(1))
        elif line.startswith("calls=") and callee == function:
            total += int(line[6:].split()[0])
    return total


def _config(target: str, rundir: Path, port: int, sims: list[int], api_key: str) -> Path:
    if target == "owngate+production":
        config = write_production_config(
            rundir, host=HOST, port=port, sims={MODEL: sims}, key_hash=key_hash(api_key)
        )
        text = config.read_text().replace("admin: {allow_loopback: true, listen: null}\n", "")
        text = text.replace(
            "policy: {paths: [policies]}", "policy: {paths: [policies], reload_interval_s: 3600}"
        )
        config.write_text(text + _QUIET)
        return config
    config = rundir / "owngate-plain.yaml"
    config.write_text(
        f"listen: {{host: {HOST}, port: {port}}}\n"
        "logging: {format: json, level: warning}\n"
        "backends:\n"
        f"  - {{id: sim, kind: vllm, base_url: 'http://{HOST}:{sims[0]}',\n"
        f"     models: [{{name: {MODEL}}}], region: local, owner: bench}}\n"
        "tenants:\n"
        f"  - {{id: bench, api_key_hashes: ['{key_hash(api_key)}'], models: ['*']}}\n" + _QUIET
    )
    return config


def _load(port: int, api_key: str, body: bytes, total: int, concurrency: int) -> int:
    """Send `total` requests over `concurrency` keep-alive connections; bytes received."""
    received = [0] * concurrency
    errors: list[str] = []

    def client(slot: int, count: int) -> None:
        connection = http.client.HTTPConnection(HOST, port, timeout=300)
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        try:
            for _ in range(count):
                connection.request("POST", "/v1/chat/completions", body, headers)
                answer = connection.getresponse()
                data = answer.read()
                if answer.status != 200:
                    errors.append(f"status {answer.status}: {data[:200]!r}")
                    return
                at = data.find(b'"error":')  # an error event: an SDK raises there
                if at >= 0:
                    errors.append(f"error event: {data[at : at + 200]!r}")
                    return
                received[slot] += data.count(b"data: {")
        except OSError as exc:
            errors.append(repr(exc))
        finally:
            connection.close()

    counts = [
        total // concurrency + (1 if i < total % concurrency else 0) for i in range(concurrency)
    ]
    threads = [threading.Thread(target=client, args=(i, n)) for i, n in enumerate(counts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(errors[0])
    return sum(received)


def _prompt(kb: float) -> str:
    """Words of a prompt of about `kb` KB (varied, as text is: a run of one repeated word
    would flatter anything that compresses or caches)."""
    words = [f"word{i % 997}" for i in range(int(kb * 1024) // 8 + 1)]
    return " ".join(words)[: max(1, int(kb * 1024))]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found (Debian: apt-get install valgrind)")
    return found


def _measure(
    target: str, args: argparse.Namespace, rundir: Path, sims: list[int]
) -> dict[str, Any]:
    api_key = "sk-bench-" + secrets.token_hex(16)
    port = free_port()
    config = _config(target, rundir, port, sims, api_key)
    out = rundir / f"callgrind-{target.replace('+', '-')}.out"
    argv = [_tool("valgrind"), "--tool=callgrind", f"--callgrind-out-file={out}"]
    argv += owngate_argv("serve", "--config", str(config))
    env = dict(child_env(), BENCH_HOSTED_KEY="sk-unused")
    gateway = Service.start(target, argv, env, rundir, port)
    try:
        gateway.wait_ready("/v1/models", {"Authorization": f"Bearer {api_key}"}, 600.0)
        gateway.wait_backend_available("sim" if target == "owngate" else f"{MODEL}-a", 600.0)
        body = json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": _prompt(args.prompt_kb)}],
                "max_tokens": args.tokens,
                "stream": args.stream,
            }
        ).encode()
        _load(port, api_key, body, max(args.concurrency * 10, 100), args.concurrency)  # warm-up
        subprocess.run(
            [_tool("callgrind_control"), "-z", str(gateway.proc.pid)],
            check=True,
            capture_output=True,
        )
        chunks = _load(port, api_key, body, args.requests, args.concurrency)
        subprocess.run(
            [_tool("callgrind_control"), "-d", str(gateway.proc.pid)],
            check=True,
            capture_output=True,
        )
    finally:
        gateway.stop()
    dumps = sorted(rundir.glob(out.name + ".*"))
    if not dumps:
        raise RuntimeError("callgrind wrote no dump of the measured requests")
    if args.keep_dumps is not None:
        args.keep_dumps.mkdir(parents=True, exist_ok=True)
        shutil.copy(dumps[0], args.keep_dumps / out.name)
    annotated = subprocess.run(
        [_tool("callgrind_annotate"), str(dumps[0])], capture_output=True, text=True, check=True
    ).stdout
    total = count_total(annotated)
    found: dict[str, Any] = {"instructions": total, "per_request": total / args.requests}
    if args.stream:
        found["chunks"] = chunks
        found["per_chunk"] = total / chunks if chunks else None
        reads = count_calls(dumps[0].read_text(errors="replace"), _READ)
        found["reads_per_chunk"] = reads / chunks if chunks else None
    return found


def _render(report: dict[str, Any]) -> str:
    shape = f"streams of {report['tokens']} tokens" if report["stream"] else "whole answers"
    if report["stream"] and report["token_interval_s"]:
        shape += f", one write per token {report['token_interval_s'] * 1000:g} ms apart"
    lines = [
        f"owngate bench instructions: {report['requests']} requests, concurrency "
        f"{report['concurrency']}, {shape}, {report['prompt_kb']:g} KB prompts, "
        "zero-latency simulators (callgrind counts)",
        f"  {'target':<20} {'instructions/request':>22} {'per chunk':>12} {'reads/chunk':>12}",
    ]
    base = None
    for target, row in report["targets"].items():
        if "error" in row:
            lines.append(f"  {target:<20} failed: {row['error']}")
            continue
        per = row["per_request"]
        base = per if base is None else base
        chunk, reads = row.get("per_chunk"), row.get("reads_per_chunk")
        lines.append(
            f"  {target:<20} {per:>22,.0f} {'-' if chunk is None else f'{chunk:,.0f}':>12}"
            f" {'-' if reads is None else f'{reads:.2f}':>12}   ({per / base:.2f}x)"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    targets = [t.strip() for t in str(args.targets).split(",") if t.strip()]
    if (
        not targets
        or set(targets) - set(TARGETS)
        or args.requests < 1
        or args.concurrency < 1
        or not args.token_interval >= 0
        or not 0 < args.prompt_kb <= 1024
    ):
        print(
            f"owngate bench instructions: --targets of {', '.join(TARGETS)}; "
            "--requests and --concurrency >= 1, --token-interval >= 0, 0 < --prompt-kb <= 1024",
            file=sys.stderr,
        )
        return 2
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print(
            "owngate bench instructions: needs valgrind (Debian: apt-get install valgrind)",
            file=sys.stderr,
        )
        return 2
    report: dict[str, Any] = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "stream": args.stream,
        "tokens": args.tokens,
        "token_interval_s": args.token_interval,
        "prompt_kb": args.prompt_kb,
        "targets": {},
    }
    with tempfile.TemporaryDirectory(prefix="owngate-bench-instructions-") as tmp:
        rundir = Path(tmp)
        env = child_env()
        sims: list[Service] = []
        try:
            for index in range(2):
                port = free_port()
                argv = owngate_argv(
                    "sim", "--host", HOST, "--port", str(port), "--model", MODEL, "--zero-latency"
                )
                argv += ["--token-interval", str(args.token_interval), "--n-ctx", "262144"]
                sims.append(Service.start(f"sim{index}", argv, env, rundir, port))
            for sim in sims:
                sim.wait_ready("/health", {}, 30.0)
            for target in targets:
                try:
                    report["targets"][target] = _measure(
                        target, args, rundir, [s.port for s in sims]
                    )
                except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
                    report["targets"][target] = {"error": str(exc)[-500:]}
        finally:
            for sim in sims:
                sim.stop()
    print(json.dumps(report) if args.json else _render(report))
    return 1 if any("error" in row for row in report["targets"].values()) else 0
