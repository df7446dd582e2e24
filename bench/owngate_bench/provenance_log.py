"""Provenance log benchmark: `owngate bench provenance-log [--quick] [--json] [--dir DIR]`.

Prints: fsync latency of the log's disk, append throughput with group commit at 1 and 16
concurrent appenders (records/s, latency, records per fsync), checkpoint signing time (the
Ed25519 signature alone, and a whole checkpoint with tile export and fsyncs), and `verify`
speed in records/s (target: >= 50,000). Nothing here is asserted; numbers go to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from gateway.provenance import Checkpoint, LogSettings, ProvenanceLog, sign_checkpoint, verify_log
from gateway.provenance.testing import log_request, seeded_signer

__all__ = ["add_arguments", "run"]

ORIGIN = "bench.owngate.example/log"


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def fsync_latency(directory: Path, rounds: int) -> dict[str, float]:
    path = directory / "fsync-probe"
    samples = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(rounds):
            os.write(fd, b"x" * 512)
            started = time.perf_counter()
            os.fsync(fd)
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return {"p50_ms": statistics.median(samples), "p99_ms": _percentile(samples, 0.99)}


async def append_throughput(directory: Path, appenders: int, requests: int) -> dict[str, float]:
    settings = LogSettings(group_commit_ms=2.0, checkpoint_every=10_000)
    log = await ProvenanceLog.open(directory, ORIGIN, seeded_signer(ORIGIN), settings=settings)
    latencies: list[float] = []
    batches_before = log.batches
    per_appender = max(1, requests // appenders)

    async def appender(worker: int) -> None:
        for n in range(per_appender):
            started = time.perf_counter()
            await log_request(log, worker * 1_000_000 + n)  # two records per request
            latencies.append((time.perf_counter() - started) * 1000 / 2)

    started = time.perf_counter()
    await asyncio.gather(*(appender(w) for w in range(appenders)))
    elapsed = time.perf_counter() - started
    records = 2 * per_appender * appenders
    batches = log.batches - batches_before
    await log.close()
    return {
        "appenders": appenders,
        "records": records,
        "records_per_s": records / elapsed,
        "append_p50_ms": statistics.median(latencies),
        "append_p99_ms": _percentile(latencies, 0.99),
        "records_per_fsync": records / max(1, batches),
    }


async def checkpoint_time(directory: Path, rounds: int) -> dict[str, float]:
    signer = seeded_signer(ORIGIN)
    checkpoint = Checkpoint(ORIGIN, 123456, bytes(32))
    started = time.perf_counter()
    for _ in range(rounds * 10):
        sign_checkpoint(checkpoint, [signer])
    sign_ms = (time.perf_counter() - started) * 1000 / (rounds * 10)
    log = await ProvenanceLog.open(directory, ORIGIN, signer, settings=LogSettings())
    samples = []
    for n in range(rounds):
        await log_request(log, 5_000_000 + n)
        started = time.perf_counter()
        await log.checkpoint()
        samples.append((time.perf_counter() - started) * 1000)
    await log.close()
    return {"sign_only_ms": sign_ms, "checkpoint_p50_ms": statistics.median(samples)}


async def fill(directory: Path, requests: int) -> None:
    settings = LogSettings(group_commit_ms=1.0, checkpoint_every=5_000)
    log = await ProvenanceLog.open(directory, ORIGIN, seeded_signer(ORIGIN), settings=settings)
    for start in range(0, requests, 256):  # 256 requests in flight at a time
        batch = range(start, min(requests, start + 256))
        await asyncio.gather(*(log_request(log, 9_000_000 + n) for n in batch))
    await log.close()


def verify_speed(directory: Path) -> dict[str, float]:
    started, cpu_started = time.perf_counter(), time.process_time()
    summary = verify_log(directory, [seeded_signer(ORIGIN).verifier()])
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "records": summary.size,
        "checkpoints": summary.checkpoints,
        "seconds": elapsed,
        "records_per_s": summary.size / elapsed,
        "records_per_cpu_s": summary.size / max(cpu, 1e-9),  # robust on a busy machine
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dir", help="directory on the disk to measure (default: a temp dir)")


def run(args: argparse.Namespace) -> int:
    scale = 1 if args.quick else 20
    with tempfile.TemporaryDirectory(dir=args.dir) as temporary:
        root = Path(temporary)
        report = {
            "fsync": fsync_latency(root, 20 * scale),
            "append_1": asyncio.run(append_throughput(root / "a1", 1, 25 * scale)),
            "append_16": asyncio.run(append_throughput(root / "a16", 16, 100 * scale)),
            "checkpoint": asyncio.run(checkpoint_time(root / "cp", 5 * scale)),
        }
        asyncio.run(fill(root / "verify", 1_250 * scale))
        report["verify"] = verify_speed(root / "verify")
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"fsync latency          p50 {report['fsync']['p50_ms']:.3f} ms, "
        f"p99 {report['fsync']['p99_ms']:.3f} ms"
    )
    for key in ("append_1", "append_16"):
        row = report[key]
        print(
            f"append, {row['appenders']:>2} appender(s)  {row['records_per_s']:>9,.0f} records/s, "
            f"p50 {row['append_p50_ms']:.2f} ms, p99 {row['append_p99_ms']:.2f} ms, "
            f"{row['records_per_fsync']:.1f} records/fsync"
        )
    cp = report["checkpoint"]
    print(
        f"checkpoint             sign {cp['sign_only_ms']:.3f} ms, "
        f"with tile export + fsyncs p50 {cp['checkpoint_p50_ms']:.2f} ms"
    )
    v = report["verify"]
    print(
        f"verify                 {v['records_per_s']:>9,.0f} records/s "
        f"({v['records_per_cpu_s']:,.0f} per CPU-second; {v['records']:,} records, "
        f"{v['checkpoints']} checkpoints, {v['seconds']:.2f} s)"
    )
    return 0
