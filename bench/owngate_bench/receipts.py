"""Receipts per request vs per batch: the same gateway with `provenance.receipts: single`
(one Ed25519 signature per request, v1) and `batch` (one per committed batch, v2), side
by side over one zero-latency simulator (the gateway is the bottleneck: the sealing
cost shows whole).

Non-stream chat at concurrency 1 and 16 (`--concurrency`), each point measured against
both gateways in turn, alternating which goes first, `--repeat` times. Reported per
point: req/s and each gateway's CPU per request (all its threads: loop, writer, sealing,
checkpoints; from /proc, steadier than req/s on a shared machine); the medians over the
runs, and the batch / single ratios, end the table.

Sealing's own cost is a small part of a request's, under the noise of a
shared machine, so it is measured alone too (`receipts_sealing`): a log in this process,
appends at the same concurrencies, the CPU time (`time.thread_time`) sealing
spends per receipt in each mode. Both logs are verified at the end, and the receipts
of requests sent 16 at a time to each gateway: the batch gateway's include batch
receipts (v2; a request alone in its batch gets v1), verified as a client would.

Exit codes: 0 ran cleanly; 1 a load point failed or a log or receipt did not verify;
2 usage.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import secrets
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from owngate_bench.loadgen import LoadSpec, run_in_subprocess
from owngate_bench.receipts_sealing import render_sealing, sealing_cost
from owngate_bench.services import HOST, Service, child_env, env_flag, free_port, owngate_argv

__all__ = ["add_arguments", "run"]

MODEL = "bench-model"
ORIGIN = "bench.owngate/receipts"
MODES = ("single", "batch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, each with an OWNGATE_BENCH_* environment default."""
    parser.add_argument(
        "--duration",
        type=float,
        default=env_flag("DURATION", "5"),
        help="measured seconds per point and mode (env OWNGATE_BENCH_DURATION, 5)",
    )
    parser.add_argument(
        "--concurrency",
        default=env_flag("CONCURRENCY", "1,16"),
        help="comma-separated client concurrencies (env OWNGATE_BENCH_CONCURRENCY, 1,16)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=env_flag("REPEAT", "3"),
        help="runs of every point; the summary takes medians (env OWNGATE_BENCH_REPEAT, 3)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        default=env_flag("QUICK", "").lower() in ("1", "true", "yes"),
        help="a very short run for smoke tests; numbers mean little (env OWNGATE_BENCH_QUICK=1)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=env_flag("JSON", ".bench/receipts.json"),
        help="where to write the results (env OWNGATE_BENCH_JSON, .bench/receipts.json)",
    )


def _config(sim_port: int, port: int, key_hash: str, logdir: Path, key: Path, mode: str) -> str:
    return (
        f"listen: {{host: {HOST}, port: {port}}}\n"
        "logging: {format: json, level: warning, access_log: false}\n"
        "backends:\n"
        f"  - {{id: sim, kind: vllm, base_url: 'http://{HOST}:{sim_port}',\n"
        f"     models: [{{name: {MODEL}}}], region: local, owner: bench}}\n"
        "tenants:\n"
        f"  - {{id: bench, api_key_hashes: ['{key_hash}'], models: ['*']}}\n"
        "admin: {allow_loopback: true, listen: null}\n"
        f"provenance: {{dir: '{logdir}', origin: {ORIGIN}/{mode}, signing_key_file: '{key}',\n"
        f"  receipts: {mode}}}\n"
    )


def _cpu_ms(result: dict[str, Any]) -> float | None:
    """CPU ms per request; None when the run failed or answered with errors (a failed
    answer costs less than a receipted one: no figure for the medians or the ratio)."""
    if "error" in result or not result.get("requests") or result.get("errors"):
        return None
    return 1000.0 * float(result["cpu_s"]["gateway"]) / float(result["requests"])


_TOGETHER = 16  # requests sent at once to check receipts: their records share batches
_ROUNDS = 10  # at most, until a batch gateway's round yields a batch receipt (v2)


def _check_receipts(gateway: Service, api_key: str, vkey: str, mode: str) -> str:
    """Receipts of requests sent `_TOGETHER` at a time, each verified with the log's key
    (what a client would do). A request alone in its batch gets a v1 receipt in either
    mode, so a batch gateway gets rounds until one yields batch receipts (v2): the form
    its run is about is then verified too. A single gateway's v2 receipt is a failure."""
    from gateway.provenance import ProvenanceError, load_verifiers, verify_receipt

    verifiers = load_verifiers([vkey])

    def envelope(_: int) -> bytes:
        answer = httpx.post(
            f"http://{HOST}:{gateway.port}/v1/chat/completions",
            headers={"Authorization": f"Bearer {api_key}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=10,
        )
        return base64.b64decode(answer.headers.get("x-owngate-receipt", ""))

    forms = {"v2 (batch)": 0, "v1 (single)": 0}
    with ThreadPoolExecutor(_TOGETHER) as pool:
        for _ in range(_ROUNDS):
            for found in pool.map(envelope, range(_TOGETHER)):
                try:
                    verify_receipt(found, verifiers)
                except ProvenanceError as exc:
                    return f"FAILED: {exc}"
                forms["v2 (batch)" if "batch" in json.loads(found) else "v1 (single)"] += 1
            if mode != "batch" or forms["v2 (batch)"]:
                break
    counted = ", ".join(f"{count} {form}" for form, count in forms.items())
    if mode == "batch" and not forms["v2 (batch)"]:
        return f"FAILED: no batch receipt (v2) in {sum(forms.values())} receipts ({counted})"
    if mode != "batch" and forms["v2 (batch)"]:
        return f"FAILED: batch receipts from a gateway set to {mode} ({counted})"
    return f"{sum(forms.values())} receipts, {counted}: verified"


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print the table and write the JSON."""
    from gateway.provenance import ProvenanceError, load_verifiers, verify_log, write_signing_key

    try:
        levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
        if not levels or min(levels) < 1 or max(levels) > 256 or not 1 <= args.repeat <= 20:
            raise ValueError
        if not 0 < args.duration <= 60:
            raise ValueError
    except ValueError:
        print("owngate bench receipts: bad --concurrency/--repeat/--duration", file=sys.stderr)
        return 2
    rundir = args.json.parent.absolute() / "receipts-run"
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir(parents=True)
    api_key = "sk-bench-" + secrets.token_hex(16)
    key_hash = "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()
    env = child_env()
    services: list[Service] = []
    rows: list[dict[str, Any]] = []
    try:
        sim_port = free_port()
        argv = owngate_argv("sim", "--kind", "vllm", "--host", HOST, "--port", str(sim_port))
        sim = Service.start(
            "sim", [*argv, "--model", MODEL, "--zero-latency"], env, rundir, sim_port
        )
        services.append(sim)
        gateways: dict[str, Service] = {}
        vkeys: dict[str, str] = {}
        for mode in MODES:
            key = rundir / f"{mode}.key"
            vkeys[mode] = write_signing_key(key, f"{ORIGIN}/{mode}")
            port = free_port()
            config = rundir / f"owngate-{mode}.yaml"
            config.write_text(_config(sim_port, port, key_hash, rundir / f"log-{mode}", key, mode))
            gateways[mode] = Service.start(
                f"owngate-{mode}", owngate_argv("serve", "--config", str(config)), env, rundir, port
            )
            services.append(gateways[mode])
        sim.wait_ready("/v1/models", {}, 30.0)
        for gateway in gateways.values():
            gateway.wait_ready("/v1/models", {"Authorization": f"Bearer {api_key}"}, 30.0)
            gateway.wait_backend_available("sim", 30.0)
        number = 0
        for repeat in range(args.repeat):
            for concurrency in levels:
                order = MODES if number % 2 == 0 else tuple(reversed(MODES))
                number += 1
                results: dict[str, Any] = {}
                for mode in order:
                    gateway = gateways[mode]
                    spec = LoadSpec(
                        host=HOST,
                        port=gateway.port,
                        api_key=api_key,
                        model=MODEL,
                        stream=False,
                        concurrency=concurrency,
                        duration_s=args.duration,
                        warmup_s=min(1.0, args.duration / 5),
                        warmup_requests=20 if args.quick else 500,
                        max_requests=200 if args.quick else None,
                        cpu_pids={"gateway": gateway.proc.pid},
                    )
                    try:
                        results[mode] = run_in_subprocess(spec, env=env)
                    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                        results[mode] = {"error": str(exc)[-2000:]}
                row = {"repeat": repeat, "concurrency": concurrency, "order": list(order)}
                for mode in MODES:
                    cpu_ms = _cpu_ms(results[mode])
                    row[mode] = {
                        "req_per_s": None if cpu_ms is None else results[mode].get("req_per_s"),
                        "cpu_ms_per_req": cpu_ms,
                        "errors": results[mode].get("errors", results[mode].get("error")),
                    }
                rows.append(row)
                print(_line(row), file=sys.stderr, flush=True)
        checks = {m: _check_receipts(gateways[m], api_key, vkeys[m], m) for m in MODES}
    finally:
        for service in reversed(services):
            service.stop()
    for mode in MODES:
        try:
            summary = verify_log(rundir / f"log-{mode}", load_verifiers([vkeys[mode]]))
            checks[f"log {mode}"] = f"verified, {summary.size} entries"
        except ProvenanceError as exc:
            checks[f"log {mode}"] = f"FAILED: {exc}"
    summary_rows = _medians(rows, levels)
    appends = 64 if args.quick else 2048
    sealing = sealing_cost(levels, args.repeat, rundir / "sealing", appends)
    print(_render(rows, summary_rows, checks))
    print(render_sealing(sealing))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {"points": rows, "medians": summary_rows, "checks": checks, "sealing": sealing}
    args.json.write_text(json.dumps(report))
    failed = any("FAILED" in text for text in checks.values()) or any(
        row[mode]["cpu_ms_per_req"] is None or row[mode]["errors"] for row in rows for mode in MODES
    )
    return 1 if failed else 0


def _line(row: dict[str, Any]) -> str:
    def cell(mode: str) -> str:
        found = row[mode]
        if found["cpu_ms_per_req"] is None:
            return f"{mode} failed: {str(found['errors'])[:200]}"
        return f"{mode} {found['req_per_s']:>7,.0f} req/s {found['cpu_ms_per_req']:.3f} ms CPU"

    return f"  run {row['repeat'] + 1} c={row['concurrency']:<3} " + "  ".join(map(cell, MODES))


def _medians(rows: list[dict[str, Any]], levels: list[int]) -> list[dict[str, Any]]:
    found = []
    for concurrency in levels:
        mine = [r for r in rows if r["concurrency"] == concurrency]
        entry: dict[str, Any] = {"concurrency": concurrency}
        for mode in MODES:
            for key in ("req_per_s", "cpu_ms_per_req"):
                values = [r[mode][key] for r in mine if r[mode][key] is not None]
                entry[f"{mode}_{key}"] = statistics.median(values) if values else None
        ratios = [
            r["batch"]["cpu_ms_per_req"] / r["single"]["cpu_ms_per_req"]
            for r in mine
            if r["batch"]["cpu_ms_per_req"] and r["single"]["cpu_ms_per_req"]
        ]
        entry["cpu_ratio_batch_over_single"] = statistics.median(ratios) if ratios else None
        found.append(entry)
    return found


def _render(
    rows: list[dict[str, Any]], medians: list[dict[str, Any]], checks: dict[str, str]
) -> str:
    def cell(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    lines = [
        "medians over runs   req/s single / batch   CPU ms/req single / batch   batch/single",
        "-" * 86,
    ]
    for entry in medians:
        lines.append(
            f"c={entry['concurrency']:<17} "
            f"{cell(entry['single_req_per_s'], 0):>9} / {cell(entry['batch_req_per_s'], 0):<9}  "
            f"{cell(entry['single_cpu_ms_per_req'], 3):>12} / "
            f"{cell(entry['batch_cpu_ms_per_req'], 3):<12}  "
            f"{cell(entry['cpu_ratio_batch_over_single'], 2):>6}"
        )
    lines += [f"{name}: {text}" for name, text in checks.items()]
    lines.append(f"({len(rows)} points; per-run figures above, on stderr)")
    return "\n".join(lines)
