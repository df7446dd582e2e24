"""The seeds' workloads end to end: a real llama-server, direct and through owngate.

`owngate bench workloads` runs the workload suites of the seeds' vLLM benchmarking
write-up (llama-benchy and `vllm bench serve` shapes: chat 1k in / 1k out, RAG 8k in /
512 out, office 4k in / 500 out, a 25k-token long context, and a request-rate sweep of
the chat shape), scaled down by `--scale` (prompt and output lengths divided by it) to
what the backend here can serve, against three targets: the backend `direct`, plain
`owngate`, and `owngate+production` (a configured trust-policy set and the signed
provenance log; see `owngate_bench.workloads_targets`). The client is a `vllm bench
serve`-compatible one (`owngate_bench.workloads_client`: Poisson arrivals, streamed,
vLLM's metric names), in its own process; `--llama-benchy PATH` adds llama-benchy as a
second driver (`owngate_bench.workloads_benchy`: its own virtualenv, offline).

Interleaved: each repetition runs every suite against every target back to back,
rotating which target goes first, so the ratios gateway ÷ direct compare neighbours in
time on a shared machine. The gateway's CPU (its process tree, from /proc) is read around
each window and reported per request and per streamed token, with how busy the whole
machine was. Each suite ends with a verdict (`owngate_bench.workloads_report`).

Backends: `llamacpp` (default): SmolLM2-135M-Instruct F16 on the real llama-server, 4
slots of 2,048 tokens (the model's context is 8,192), one thread; `--tiny` serves the
random-weight tiny model instead (smoke runs). `sim-gh200`: the simulator as a GH200-class
vLLM server. With `llamacpp` the run ends with the real-server routing comparison
(`owngate_bench.workloads_routing`): two llama-servers that differ only in slots behind
owngate, once per routing strategy.

Exit codes: 0 ran (every request completed); 1 a target failed or requests failed; 2 usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

from owngate_bench.loadgen import run_json_module
from owngate_bench.services import HOST, child_env, env_flag, machine_busy_seconds, tree_cpu_seconds
from owngate_bench.workloads_client import ClientSpec
from owngate_bench.workloads_report import compare, pooled_cpu, render
from owngate_bench.workloads_targets import (
    BACKENDS,
    MODEL,
    TARGETS,
    backend,
    gateways,
    real_backend_helper,
)

__all__ = ["SEED_SUITES", "Suite", "add_arguments", "run", "suites"]


@dataclasses.dataclass(frozen=True)
class Suite:
    """One workload at the seeds' size; `scaled` divides its lengths."""

    name: str
    input_len: int
    output_len: int
    max_concurrency: int
    seed_shape: str

    def spec(
        self,
        scale: float,
        requests: int,
        rate: float,
        port: int,
        headers: dict[str, str],
        seeds: tuple[int, int],
    ) -> ClientSpec:
        return ClientSpec(
            host=HOST,
            port=port,
            model=MODEL,
            input_len=max(16, round(self.input_len / scale)),
            output_len=max(8, round(self.output_len / scale)),
            num_prompts=requests,
            request_rate=rate,
            max_concurrency=self.max_concurrency,
            seed=seeds[0],
            arrival_seed=seeds[1],
            headers=headers,
        )


SEED_SUITES = (
    Suite("chat", 1024, 1024, 1, "chat 1k in / 1k out, c=1"),
    Suite("chat-c4", 1024, 1024, 4, "chat 1k in / 1k out, c=4"),
    Suite("rag", 8192, 512, 1, "RAG 8k in / 512 out"),
    Suite("office", 4096, 500, 4, "office 4k in / 500 out, c=4"),
    Suite("long", 25000, 128, 1, "long context 25k in"),
)
SWEEP = Suite("sweep", 1024, 1024, 64, "chat 1k / 1k, open loop at a request rate")
DEFAULTS = {  # backend -> scale, sweep rates (req/s)
    "llamacpp": (32.0, "0.25,0.5"),
    "sim-gh200": (4.0, "2,4,8"),
}


def suites(quick: bool) -> tuple[Suite, ...]:
    return SEED_SUITES[:1] if quick else SEED_SUITES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=env_flag("WORKLOADS_BACKEND", "llamacpp"),
        help="real llama-server with SmolLM2 (default) or the simulator as a GH200-class "
        "server (env OWNGATE_BENCH_WORKLOADS_BACKEND)",
    )
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (3)")
    parser.add_argument(
        "--scale",
        type=float,
        default=0.0,
        help="divide the seeds' prompt and output lengths by this (llamacpp 32, sim-gh200 4)",
    )
    parser.add_argument(
        "--requests", type=int, default=2, help="requests per suite and repetition (2)"
    )
    parser.add_argument(
        "--rates", default="", help="sweep request rates, req/s (llamacpp 0.25,0.5; sim 2,4,8)"
    )
    parser.add_argument("--sweep-requests", type=int, default=4, help="requests per sweep rate (4)")
    parser.add_argument(
        "--routing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="end with the real-server routing run (default: on for llamacpp, off with --quick)",
    )
    parser.add_argument(
        "--llama-benchy",
        type=Path,
        default=env_flag("LLAMA_BENCHY", "") or None,
        help="also drive the suites with this llama-benchy executable (its own venv: it "
        "needs transformers; env OWNGATE_BENCH_LLAMA_BENCHY)",
    )
    parser.add_argument(
        "--suites",
        default="",
        help="comma-separated suites to run (default: all of "
        + ", ".join(s.name for s in SEED_SUITES)
        + ", and the sweep)",
    )
    parser.add_argument(
        "--vllm-client",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="drive the suites with the vllm-bench-serve-compatible client (on; "
        "--no-vllm-client with --llama-benchy runs llama-benchy alone)",
    )
    parser.add_argument("--tiny", action="store_true", help="llamacpp: the tiny random model")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: the chat suite and one rate, 2 reps"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(env_flag("JSON", ".bench/workloads.json")),
        help="where to write the results (env OWNGATE_BENCH_JSON, .bench/workloads.json)",
    )


_SHAPE_KEYS = ("input_len", "output_len", "num_prompts", "request_rate", "max_concurrency")


def _window(spec: ClientSpec, gateway_pids: dict[str, int]) -> dict[str, Any]:
    """Run one client; the client's summary plus every gateway's CPU seconds meanwhile
    (`cpu_s`, by target) and the window's wall time (`window_s`)."""
    budget = 0.0 if math.isinf(spec.request_rate) else spec.num_prompts / spec.request_rate
    budget += spec.timeout_s * spec.num_prompts + 60.0
    before = {t: tree_cpu_seconds(pid) for t, pid in gateway_pids.items()}
    started = time.monotonic()
    summary = run_json_module("owngate_bench.workloads_client", spec.to_json(), budget, child_env())
    summary["window_s"] = time.monotonic() - started
    summary["cpu_s"] = {t: tree_cpu_seconds(pid) - before[t] for t, pid in gateway_pids.items()}
    return summary


def _gateway_cpu(runs: list[dict[str, Any]]) -> None:
    """Set each gateway summary's `gateway_cpu_s`: its CPU in its own windows, less what
    it burns idle (scrapes, health checks, checkpoints), measured over the other
    targets' windows of the same suite and scaled to its own window's length."""
    idle_cpu: dict[str, float] = {}
    idle_wall: dict[str, float] = {}
    for run_results in runs:
        for target, summary in run_results.items():
            for gateway, cpu in summary["cpu_s"].items():
                if gateway != target:
                    idle_cpu[gateway] = idle_cpu.get(gateway, 0.0) + cpu
                    idle_wall[gateway] = idle_wall.get(gateway, 0.0) + summary["window_s"]
    for run_results in runs:
        for target, summary in run_results.items():
            if target in summary["cpu_s"]:
                idle_rate = idle_cpu.get(target, 0.0) / max(idle_wall.get(target, 0.0), 1e-9)
                summary["gateway_cpu_gross_s"] = summary["cpu_s"][target]
                summary["gateway_idle_cores"] = idle_rate
                summary["gateway_cpu_s"] = max(
                    0.0, summary["cpu_s"][target] - idle_rate * summary["window_s"]
                )


def known_answers(
    backend_url: str, gateways: dict[str, Any], headers: dict[str, str]
) -> dict[str, str]:
    """Each target's answer to the known question (setup.sh's probe: "What is the capital
    of France?" at temperature 0), direct and through each gateway, as the run serves the
    model (its slots, context and threads, not the probe's): a model that answers nonsense
    still streams tokens at full speed, and the run would time a broken server. A target
    whose answer lacks the known one, or that fails, maps to why."""
    helper = real_backend_helper()
    found: dict[str, str] = {}
    for target in TARGETS:
        url = backend_url if target == "direct" else gateways[target].url
        try:
            found[target] = helper.ask(
                url, helper.KNOWN_QUESTION, timeout_s=60.0, headers=headers, model=MODEL
            )
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            found[target] = f"failed: {exc}"
    return found


def wrong_answers(answers: dict[str, str]) -> list[str]:
    """The targets whose answer does not contain the known one."""
    wanted = str(real_backend_helper().KNOWN_ANSWER).lower()
    return [t for t, answer in answers.items() if wanted not in answer.lower()]


def run(args: argparse.Namespace) -> int:
    # SIGTERM unwinds like Ctrl-C: the servers it started are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.reps < 1 or args.requests < 1 or args.sweep_requests < 1 or args.scale < 0:
        print("owngate bench workloads: --reps, --requests, --sweep-requests >= 1", file=sys.stderr)
        return 2
    scale_default, rates_default = DEFAULTS[args.backend]
    scale = args.scale or scale_default * (4 if args.quick else 1)
    try:
        rates = [float(r) for r in (args.rates or rates_default).split(",") if r.strip()]
    except ValueError:
        print(f"owngate bench workloads: bad --rates {args.rates!r}", file=sys.stderr)
        return 2
    reps = min(args.reps, 2) if args.quick else args.reps
    requests = 2 if args.quick else args.requests
    sweep_requests = 3 if args.quick else args.sweep_requests
    rates = rates[-1:] if args.quick else rates
    routing = (
        args.routing
        if args.routing is not None
        else (args.backend == "llamacpp" and not args.quick)
    )
    rundir = args.json.parent.absolute() / "workloads-run"
    rundir.mkdir(parents=True, exist_ok=True)
    api_key = "sk-bench-" + secrets.token_hex(8)
    headers = {"Authorization": f"Bearer {api_key}"}
    plan = [
        (s, requests if s.name != "long" else max(1, requests // 2), math.inf)
        for s in suites(args.quick)
    ]
    plan += [(dataclasses.replace(SWEEP, name=f"sweep-{r:g}"), sweep_requests, r) for r in rates]
    if args.suites:
        wanted = {name.strip() for name in args.suites.split(",") if name.strip()}
        plan = [
            p
            for p in plan
            if p[0].name in wanted or (p[0].name.startswith("sweep") and "sweep" in wanted)
        ]
        if not plan:
            print(f"owngate bench workloads: no suite in {args.suites!r}", file=sys.stderr)
            return 2

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    busy_before, wall_before = machine_busy_seconds(), time.monotonic()
    results: dict[str, list[dict[str, Any]]] = {suite.name: [] for suite, _, _ in plan}
    shapes = {
        suite.name: {
            k: v
            for k, v in json.loads(suite.spec(scale, count, rate, 0, {}, (0, 0)).to_json()).items()
            if k in _SHAPE_KEYS
        }
        for suite, count, rate in plan
    }
    vllm_reps = reps if args.vllm_client else 0
    with backend(args.backend, rundir, tiny=args.tiny) as found:
        log(f"workloads: backend {found.describe}")
        with gateways(rundir, TARGETS, [found], api_key) as started:
            answers: dict[str, str] | None = None
            if args.backend == "llamacpp" and not args.tiny:
                answers = known_answers(found.url, started, headers)
                wrong = wrong_answers(answers)
                if wrong:
                    for target in wrong:
                        log(f"  {target} answered {answers[target][:200]!r}")
                    log(
                        "owngate bench workloads: the served model does not answer the known "
                        f"question correctly ({', '.join(wrong)}): nothing measured"
                    )
                    return 1
            pids = {target: service.proc.pid for target, service in started.items()}
            for rep in range(vllm_reps):
                for index, (suite, count, rate) in enumerate(plan):
                    order = TARGETS[rep % len(TARGETS) :] + TARGETS[: rep % len(TARGETS)]
                    run_results: dict[str, Any] = {}
                    for target in order:
                        service = started.get(target)
                        port = found.port if service is None else service.port
                        # Fresh prompts per target (no prompt-cache hits), same arrivals.
                        seeds = (1000 * rep + 10 * index + TARGETS.index(target), 100 * rep + index)
                        spec = suite.spec(scale, count, rate, port, headers, seeds)
                        summary = _window(spec, pids)
                        run_results[target] = summary
                        log(
                            f"  rep {rep + 1}/{reps} {suite.name:10} {target:20} TTFT p50 "
                            f"{summary['median_ttft_ms']:8.1f} ms  ITL p50 "
                            f"{summary['median_itl_ms']:6.1f} ms  "
                            f"{summary['output_throughput']:7.1f} tok/s  "
                            f"ok {summary['completed']}/{count}"
                        )
                    results[suite.name].append(run_results)
            benchy = None
            if args.llama_benchy is not None:
                from owngate_bench.workloads_benchy import benchy_run

                tokenizer = (
                    found.tokenizer
                    or real_backend_helper().install(with_smollm2=True).smollm2_tokenizer_dir
                )
                urls = {t: (started[t].url if t in started else found.url) for t in TARGETS}
                benchy_shapes = [
                    (s.name, shapes[s.name]) for s, _, rate in plan if math.isinf(rate)
                ]
                benchy = benchy_run(
                    args.llama_benchy, tokenizer, rundir, api_key, urls, benchy_shapes, reps, log
                )
        for runs in results.values():
            _gateway_cpu(runs)
        routing_report = None
        if routing and args.backend == "llamacpp":
            from owngate_bench.workloads_routing import routing_run

            routing_report = routing_run(rundir, api_key, scale, reps, args.tiny, log)
    busy = machine_busy_seconds() - busy_before
    wall = time.monotonic() - wall_before
    report: dict[str, Any] = {
        "schema": "owngate.bench.workloads/1",
        "backend": args.backend,
        "backend_detail": found.describe,
        "known_answer": answers,
        "scale": scale,
        "reps": reps,
        "machine": {"cores": os.cpu_count(), "busy_cores": busy / wall, "wall_s": wall},
        "suites": [
            {
                "name": suite.name,
                "seed_shape": suite.seed_shape,
                "shape": shapes[suite.name],
                "targets": compare(results[suite.name], TARGETS),
                "runs": results[suite.name],
            }
            for suite, _, _ in plan
            if results[suite.name]
        ],
        "routing": routing_report,
        "llama_benchy": benchy
        if benchy is not None
        else "not run: pass --llama-benchy PATH (llama-benchy needs transformers, kept out "
        "of the dev lock; docs/performance.md has the install)",
    }
    report["pooled_cpu"] = pooled_cpu(report["suites"], TARGETS[1:])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(f"\nresults: {args.json}")
    failed = sum(row["failed"] for s in report["suites"] for row in s["targets"].values())
    return 1 if failed else 0
