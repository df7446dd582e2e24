"""The cost of one routing decision: `Picker.order` on realistic pools, one call at a time.

Pools of 2 and 8 vLLM backends declared with 64 slots each, built by `Registry.build`
as the gateway builds them, each with some requests in flight and a fresh scraped load
(running, waiting, KV use). The score strategy is called with one of 1,024 prompt-prefix
keys in turn, a quarter of them never served (no affinity entry) and the rest remembered
on some backend, as after a warm-up; least in-flight and round robin are timed the same
way for comparison. `prefix_span` (the prefix digest and its length, which the plan of
gateway/routing/router.py computes for the score strategy before ordering; reported as
`prefix_key`) is timed on the first request body of each benchmark workload. Method of
`owngate bench policy`: `perf_counter_ns` around each call, the garbage collector off
while timing, nearest-rank p50 / p99.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import random
import time
from collections.abc import Callable
from typing import Any

from gateway.config.schema import (
    BackendSettings,
    CapacitySettings,
    GatewaySettings,
    ModelSettings,
    PoolSettings,
    RoutingSettings,
)
from gateway.routing.picker import Picker
from gateway.routing.registry import Registry, Route
from gateway.routing.scorers.affinity import prefix_span
from gateway.routing.signals import BackendLoad
from owngate_bench.arrivals import CHAT, OFFICE, RAG, TraceSpec, build_trace

__all__ = ["POOL_SIZES", "decision_cost"]

POOL_SIZES = (2, 8)
_MODEL = "bench-model"
_PREFIXES = 1024


def _routes(size: int) -> tuple[Route, ...]:
    backends = tuple(
        BackendSettings(
            id=f"vllm-{i}",
            kind="vllm",
            base_url=f"http://127.0.0.1:{18000 + i}",
            models=(ModelSettings(name=_MODEL),),
            region="local",
            owner="bench",
            capacity=CapacitySettings(max_concurrency=64),
        )
        for i in range(size)
    )
    return Registry.build(GatewaySettings(backends=backends), environ={}).routes[_MODEL]


def _time(call: Callable[[int], object], calls: int) -> dict[str, float]:
    for i in range(min(calls, 1000)):
        call(i)  # warm up
    samples: list[int] = []
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for i in range(calls):
            start = clock()
            call(i)
            samples.append(clock() - start)
    finally:
        gc.enable()
    samples.sort()
    return {
        "p50_us": samples[len(samples) // 2] / 1000,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000,
        "max_us": samples[-1] / 1000,
    }


def _order_nth(
    picker: Picker, routes: tuple[Route, ...], prefixes: list[bytes], i: int
) -> list[Route]:
    return picker.order(_MODEL, routes, prefixes[i % len(prefixes)])


def _prefix_span(body: dict[str, Any], _: int) -> tuple[bytes, int] | None:
    return prefix_span(body, 4096)  # the gateway's default routing.affinity_prefix_bytes


def decision_cost(calls: int) -> dict[str, Any]:
    """p50 / p99 / max microseconds of `Picker.order` per pool size and strategy."""
    rng = random.Random(5)  # noqa: S311 - a reproducible benchmark set-up
    rows: list[dict[str, Any]] = []
    for size in POOL_SIZES:
        routes = _routes(size)
        loads = {}
        for route in routes:
            route.backend.inflight = rng.randrange(0, 64)
            loads[route.backend.id] = BackendLoad(
                running=float(rng.randrange(0, 64)),
                waiting=float(rng.randrange(0, 8)),
                kv_usage=rng.random(),
                slots_total=None,
            )
        prefixes = [
            hashlib.blake2b(bytes([i % 256, i // 256]), digest_size=16).digest()
            for i in range(_PREFIXES)
        ]
        for strategy in ("score", "least_inflight", "round_robin"):
            routing = RoutingSettings(default=PoolSettings(strategy=strategy))
            picker = Picker(routing, loads.get, random.Random(7))  # noqa: S311 - tie-breaks
            for prefix in prefixes[_PREFIXES // 4 :]:
                picker.served(prefix, rng.choice(routes).backend.id)

            order = functools.partial(_order_nth, picker, routes, prefixes)
            rows.append({"backends": size, "strategy": strategy, **_time(order, calls)})
    spec = TraceSpec(mix=((CHAT, 1.0), (RAG, 1.0), (OFFICE, 1.0)), rate=50.0, duration_s=1.0)
    seen: dict[str, dict[str, Any]] = {}
    for request in build_trace(spec):
        seen.setdefault(request.workload, request.body)
    prefix_rows = []
    for workload, body in sorted(seen.items()):
        digest = functools.partial(_prefix_span, body)
        prefix_rows.append({"workload": workload, **_time(digest, max(1, calls // 10))})
    return {"calls": calls, "rows": rows, "prefix_key": prefix_rows}
