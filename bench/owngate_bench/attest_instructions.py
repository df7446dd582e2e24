"""`owngate bench attest --instructions`: the sidecar's instructions per request, counted
by callgrind, so that a change to its request path can be measured on a busy machine.

The wall-clock `owngate bench attest` moves by 2x between runs on a shared machine, and
its CPU per request with it. This starts one zero-latency simulator and one `owngate
attest` sidecar in front of it under `valgrind --tool=callgrind --separate-threads=yes`
(as `owngate bench instructions` does for the gateway), sends `--requests` requests of
one shape over one keep-alive connection after a warm-up, zeroing the counters
(`callgrind_control -z`) before them and dumping them (`-d`) after, and reads the
instructions per request of the loop's thread (where every request runs: the relay, the
statement and its signature, the log's append on the loop) and of the log's threads
(its writer and checkpoint: their work comes in batches, on timers, so their share moves
with how many batches fall into the window), and how many of the loop thread's
instructions were the Ed25519 signature (OpenSSL's `ossl_ed25519_sign`, inclusive).

Shapes (`--shape`): `bench`, the requests the time-based bench's `sidecar` target sends
(no request id, no salts: the sidecar draws both), and `gateway`, with the
`x-request-id` and `x-owngate-salts` a gateway sends. Both are non-stream chat of the
load generator's body. What it cannot show: time spent in the kernel and waiting (the
socket calls themselves, wake-ups), and SHA-256 is over-counted (valgrind hides the
CPU's SHA extensions from OpenSSL).
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
from pathlib import Path
from typing import Any

from owngate_bench.instructions import count_total
from owngate_bench.loadspec import LoadSpec
from owngate_bench.services import HOST, Service, child_env, free_port, owngate_argv

__all__ = ["SHAPES", "add_arguments", "measure", "render", "run", "signature_count"]

MODEL = "bench-model"
SHAPES = ("bench", "gateway")
SIGNATURE = "ossl_ed25519_sign"
_WARMUP = 300
# `callgrind_annotate --inclusive=yes`: "<count> (<share>)  <file>:<function> [<object>]"
_INCLUSIVE = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+\S*?:?(\S+) \[", re.M)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`owngate bench attest`'s options for this run."""
    group = parser.add_argument_group(
        "--instructions", "the sidecar alone under callgrind (owngate_bench.attest_instructions)"
    )
    group.add_argument(
        "--instructions",
        action="store_true",
        help="instead: count the sidecar's instructions per request under callgrind",
    )
    group.add_argument("--requests", type=int, default=500, help="measured requests (500)")
    group.add_argument(
        "--shape",
        choices=("bench", "gateway"),
        default="bench",
        help="bench: no request id or salts (as the sidecar target); gateway: with both",
    )
    group.add_argument(
        "--keep-dumps", type=Path, default=None, help="copy the callgrind dumps here"
    )


def signature_count(annotated_inclusive: str, function: str = SIGNATURE) -> int:
    """The inclusive instructions of `function` in `callgrind_annotate --inclusive=yes`
    output (0 when it does not appear)."""
    for found in _INCLUSIVE.finditer(annotated_inclusive):
        if found.group(2).rpartition(":")[2] == function:
            return int(found.group(1).replace(",", ""))
    return 0


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found (Debian: apt-get install valgrind)")
    return found


def _send(port: int, shape: str, count: int) -> None:
    spec = LoadSpec(
        host=HOST,
        port=port,
        api_key="sk-bench",
        model=MODEL,
        stream=False,
        concurrency=1,
        duration_s=1.0,
    )
    body = spec.request_bytes().partition(b"\r\n\r\n")[2]
    headers = {
        "Authorization": "Bearer sk-bench",
        "Content-Type": "application/json",
        "Accept": "application/json",
    }
    connection = http.client.HTTPConnection(HOST, port, timeout=600)
    try:
        for index in range(count):
            sent = dict(headers)
            if shape == "gateway":
                sent["x-request-id"] = f"chatcmpl-bench{index:012d}"
                sent["x-owngate-salts"] = secrets.token_hex(32) + "." + secrets.token_hex(32)
            connection.request("POST", "/v1/chat/completions", body, sent)
            answer = connection.getresponse()
            data = answer.read()
            if answer.status != 200 or answer.getheader("x-owngate-attest") is None:
                raise RuntimeError(f"sidecar answered {answer.status}: {data[:200]!r}")
    finally:
        connection.close()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Count one run: {shape, requests, loop_per_request, log_threads_per_request,
    signature_per_request}."""
    valgrind, control = _tool("valgrind"), _tool("callgrind_control")
    annotate = _tool("callgrind_annotate")
    from gateway.provenance import write_signing_key

    env = child_env()
    with tempfile.TemporaryDirectory(prefix="owngate-bench-attest-instr-") as tmp:
        rundir = Path(tmp)
        sim_port, port = free_port(), free_port()
        argv = owngate_argv("sim", "--host", HOST, "--port", str(sim_port), "--model", MODEL)
        sim = Service.start("sim", [*argv, "--zero-latency"], env, rundir, sim_port)
        sidecar = None
        try:
            sim.wait_ready("/health", {}, 30.0)
            write_signing_key(rundir / "sidecar.key", "sidecar")
            out = rundir / "callgrind.out"
            argv = [valgrind, "--tool=callgrind", "--separate-threads=yes"]
            argv += [f"--callgrind-out-file={out}"]
            argv += owngate_argv(
                "attest",
                "--listen",
                f"{HOST}:{port}",
                "--backend",
                sim.url,
                "--key",
                str(rundir / "sidecar.key"),
                "--log",
                str(rundir / "log"),
            )
            sidecar = Service.start("sidecar", argv, env, rundir, port)
            sidecar.wait_ready("/v1/models", {}, 600.0)
            _send(port, args.shape, _WARMUP)
            subprocess.run([control, "-z", str(sidecar.proc.pid)], check=True, capture_output=True)
            _send(port, args.shape, args.requests)
            subprocess.run([control, "-d", str(sidecar.proc.pid)], check=True, capture_output=True)
        finally:
            if sidecar is not None:
                sidecar.stop(60.0)
            sim.stop()
        dumps = sorted(rundir.glob("callgrind.out.1-*"))  # the first dump, one per thread
        if not dumps:
            raise RuntimeError("callgrind wrote no dump of the measured requests")
        if args.keep_dumps is not None:
            args.keep_dumps.mkdir(parents=True, exist_ok=True)
            for dump in dumps:
                shutil.copy(dump, args.keep_dumps / dump.name)
        counts = {}
        for dump in dumps:
            text = subprocess.run(
                [annotate, "--inclusive=yes", str(dump)], capture_output=True, text=True, check=True
            ).stdout
            counts[dump.name] = (count_total(text), signature_count(text))
    loop = dumps[0].name  # thread 01: the main thread, which runs the loop
    per = float(args.requests)
    return {
        "shape": args.shape,
        "requests": args.requests,
        "loop_instructions": counts[loop][0],
        "loop_per_request": counts[loop][0] / per,
        "log_threads_per_request": sum(c[0] for n, c in counts.items() if n != loop) / per,
        "signature_per_request": counts[loop][1] / per,
        "threads": len(counts),
    }


def render(found: dict[str, Any]) -> str:
    loop, log = found["loop_per_request"], found["log_threads_per_request"]
    sign = found["signature_per_request"]
    return "\n".join(
        [
            f"owngate bench attest --instructions: {found['requests']} requests, shape "
            f"{found['shape']}, one keep-alive connection, zero-latency simulator "
            "(callgrind counts)",
            f"  loop thread          {loop:>12,.0f} instructions/request",
            f"    of which Ed25519   {sign:>12,.0f} ({SIGNATURE}, inclusive)",
            f"    the rest           {loop - sign:>12,.0f}",
            f"  log threads ({found['threads'] - 1})      {log:>12,.0f} (batched on timers: "
            "moves with the window)",
            f"  all threads          {loop + log:>12,.0f}",
        ]
    )


def run(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.shape not in SHAPES:
        print(
            f"owngate bench attest --instructions: --requests >= 1, --shape of {SHAPES}",
            file=sys.stderr,
        )
        return 2
    try:
        found = measure(args)
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        print(f"owngate bench attest --instructions: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(found) if args.json else render(found))
    return 0
