"""`owngate bench state`: what shared state adds to each request.

Times `acquire` (admission) and `Admission.release` (completion, with tokens) with every
limit set, so every check runs: `MemoryState` always, `RedisState` when a URL is given
(`--redis-url` or OWNGATE_STATE_BENCH_REDIS_URL). Prints p50/p99 per operation, on
uvloop as the gateway runs.
Exit codes: 0 measured, 1 Redis unreachable, 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import TextIO

import uvloop

from gateway.state import SharedState, TenantLimits, create_state

__all__ = ["add_arguments", "measure", "run"]

# High enough that nothing is refused, set so that every check and charge runs.
_LIMITS = TenantLimits(requests_per_minute=10**9, tokens_per_minute=10**12, concurrent=10**6)


async def measure(state: SharedState, requests: int, concurrency: int) -> dict[str, list[float]]:
    """Seconds each acquire and each release took, over `requests` requests run by
    `concurrency` workers."""
    timings: dict[str, list[float]] = {"acquire": [], "release": []}
    clock = time.perf_counter

    async def worker(count: int) -> None:
        for _ in range(count):
            started = clock()
            admission = await state.acquire("bench", _LIMITS)
            admitted = clock()
            await admission.release(100)
            timings["acquire"].append(admitted - started)
            timings["release"].append(clock() - admitted)

    share, extra = divmod(requests, concurrency)
    await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))
    return timings


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


async def _run(
    url: str | None, requests: int, concurrency: int, timeout_s: float, out: TextIO
) -> int:
    backends: list[tuple[str, SharedState]] = [("memory", create_state("memory"))]
    if url:
        prefix = f"owngate-bench-{os.getpid()}"
        redis = create_state("redis", url, key_prefix=prefix, timeout_s=timeout_s)
        backends.append(("redis", redis))
    out.write(f"{'backend':<8} {'op':<8} {'n':>7} {'p50_us':>9} {'p99_us':>9}\n")
    status = 0
    for name, state in backends:
        await state.start()
        try:
            if not state.healthy:
                out.write(f"{name:<8} unreachable: {state.degraded_reason}\n")
                status = 1
                continue
            await measure(state, min(requests, 200), concurrency)  # warm up connections
            timings = await measure(state, requests, concurrency)
            if not state.healthy:
                out.write(f"{name:<8} degraded during the run: {state.degraded_reason}\n")
                status = 1
            for op, values in timings.items():
                p50, p99 = _quantile(values, 0.5) * 1e6, _quantile(values, 0.99) * 1e6
                out.write(f"{name:<8} {op:<8} {len(values):>7} {p50:>9.1f} {p99:>9.1f}\n")
        finally:
            await state.close()
    return status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("OWNGATE_STATE_BENCH_REDIS_URL"),
        help="also measure RedisState here (env OWNGATE_STATE_BENCH_REDIS_URL)",
    )
    parser.add_argument("--requests", type=int, default=5000, help="requests per backend")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    parser.add_argument(
        "--timeout-ms", type=float, default=50.0, help="RedisState's per-call timeout"
    )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Measure and print the table to `out` (default: stdout, where logs go too)."""
    out = out or sys.stdout
    if args.requests < 2 or args.concurrency < 1 or args.timeout_ms <= 0:
        print(
            "owngate bench state: --requests >= 2, --concurrency >= 1 and --timeout-ms > 0, please",
            file=sys.stderr,
        )
        return 2
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(
            _run(args.redis_url, args.requests, args.concurrency, args.timeout_ms / 1000, out)
        )
