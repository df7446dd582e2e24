"""Routing on real servers: two llama-servers differing only in slots, behind owngate.

`owngate bench routing` compares strategies on simulated pools whose small server is
also much slower per token (its headline, score's p99 TTFT at 0.012x round robin's,
comes from that). Here both servers run the same binary, model (SmolLM2-135M F16),
context per slot (2,048 tokens) and thread count (1); one has `-np 1`, the other
`-np 4`. Plain owngate sits in front with each routing strategy (score,
least_inflight, round_robin) in turn, a fresh gateway per strategy and repetition, the
same open-loop Poisson chat load (`owngate_bench.workloads_client`) for each; strategies
are interleaved within each repetition. A strategy "won" when its worst p99 TTFT over
the repetitions is below every other strategy's best.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from owngate_bench.loadgen import run_json_module
from owngate_bench.services import HOST, child_env
from owngate_bench.workloads_client import ClientSpec
from owngate_bench.workloads_targets import MODEL, Backend, gateways, real_backend_helper

__all__ = ["STRATEGIES", "routing_run", "verdict"]

STRATEGIES = ("score", "least_inflight", "round_robin")
SLOT_CTX = 2048


def verdict(p99s: dict[str, list[float]], failed: dict[str, int] | None = None) -> str:
    """Which strategy won, if one did: its worst p99 TTFT below every other's best. Not
    judged when requests failed under a strategy: a p99 over its survivors is no p99."""
    broken = {name: count for name, count in (failed or {}).items() if count}
    if broken:
        named = ", ".join(f"{count} under {name}" for name, count in sorted(broken.items()))
        return f"not judged: requests failed ({named})"
    if any(len(v) < 2 for v in p99s.values()):
        return "one repetition: no spread to judge (use --reps 3)"
    for name, values in p99s.items():
        others = [min(v) for other, v in p99s.items() if other != name]
        if others and max(values) < min(others):
            return f"{name} won: its worst p99 TTFT is below every other strategy's best"
    return "no strategy won: the p99 TTFT ranges over the repetitions overlap"


def routing_run(
    rundir: Path, api_key: str, scale: float, reps: int, tiny: bool, log: Callable[[str], None]
) -> dict[str, Any]:
    helper = real_backend_helper()
    installation = helper.install(with_smollm2=not tiny)
    model = installation.tiny_model if tiny else installation.smollm2_model
    shape: dict[str, Any] = {
        "input_len": max(16, round(1024 / scale)),
        "output_len": max(8, round(512 / scale)),
        "num_prompts": 16,
        "request_rate": 1.5,
        "max_concurrency": 64,
    }
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in STRATEGIES}
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(
                helper.running_llama_server(
                    installation,
                    model=model,
                    alias=f"{MODEL}-np{slots}",
                    slots=slots,
                    ctx_size=SLOT_CTX * slots,
                    threads=1,
                    log_dir=rundir,
                )
            )
            for slots in (1, 4)
        ]
        backends = [Backend("llamacpp", s.port, {"slots": s.slots}) for s in servers]
        for rep in range(reps):
            order = STRATEGIES[rep % 3 :] + STRATEGIES[: rep % 3]
            for strategy in order:
                with gateways(rundir, ("owngate",), backends, api_key, strategy) as started:
                    service = started["owngate"]
                    spec = ClientSpec(
                        host=HOST,
                        port=service.port,
                        model=MODEL,
                        seed=100 * rep + STRATEGIES.index(strategy),
                        arrival_seed=rep,
                        headers={"Authorization": f"Bearer {api_key}"},
                        **shape,
                    )
                    summary = run_json_module(
                        "owngate_bench.workloads_client", spec.to_json(), 600.0, child_env()
                    )
                runs[strategy].append(summary)
                log(
                    f"  routing rep {rep + 1}/{reps} {strategy:15} TTFT p50 "
                    f"{summary['median_ttft_ms']:8.1f} ms  p99 {summary['p99_ttft_ms']:8.1f} ms"
                    f"  ok {summary['completed']}/{shape['num_prompts']}"
                )
    strategies: dict[str, Any] = {}
    for strategy, summaries in runs.items():
        done = [s for s in summaries if s["completed"]]
        strategies[strategy] = {
            key: statistics.median(s[key] for s in done) if done else None
            for key in ("median_ttft_ms", "p99_ttft_ms", "p99_e2el_ms", "output_throughput")
        }
        strategies[strategy]["p99_ttft_ms_per_rep"] = [s["p99_ttft_ms"] for s in done]
        strategies[strategy]["failed"] = sum(s["failed"] for s in summaries)
    return {
        "servers": ["llama-server -np 1 -c 2048", "llama-server -np 4 -c 8192"],
        "model": str(model),
        "shape": shape,
        "reps": reps,
        "strategies": strategies,
        "verdict": verdict(
            {k: v["p99_ttft_ms_per_rep"] for k, v in strategies.items()},
            {k: v["failed"] for k, v in strategies.items()},
        ),
        "runs": runs,
    }
