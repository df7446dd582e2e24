"""The routing benchmark: a `--quick` run end to end over real processes, and its parts.

Timing is never asserted (CI machines are shared): the end-to-end run checks that every
strategy replayed the whole trace without errors, that the report has its documented
shape and that the counts are not zero; the unit tests check the trace, the capacity
model, the generated gateway config and the statistics on fixed data.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.config import parse_config
from gateway.sim import SimSettings
from owngate_bench import routing, routing_scenarios
from owngate_bench.arrivals import CHAT, RAG, TraceSpec, arrival_times, build_trace
from owngate_bench.routing_report import (
    evaluate_targets,
    median_targets,
    quantiles,
    render,
    summarize,
)
from owngate_bench.simhost import SimHost
from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.bench
SUMMARY_KEYS = {"outcomes", "ttft_ms", "latency_ms", "throughput", "queued", "share"}


def test_quick_run_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "routing.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OWNGATE_BENCH_")}
    # One scenario (two gateway runs) keeps this well under 20 s; the prefix scenario
    # exercises the most: prefix caches, affinity on and off.
    argv = ["bench", "routing", "--quick", "--scenarios", "prefix", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # this run takes ~8 s; the timeout only bounds a hang
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())

    assert report["schema"] == "owngate.bench.routing/1"
    assert report["settings"]["quick"] is True
    assert list(report["scenarios"]) == ["prefix"]
    scenario = report["scenarios"]["prefix"]
    assert list(scenario["arms"]) == ["score", "score_no_affinity"]
    requests = scenario["trace"]["requests"]
    assert requests > 0
    assert set(scenario["capacity_req_per_s"]) == {"vllm-a", "vllm-b"}
    assert set(scenario["backends"]) == {"vllm-a", "vllm-b"}
    for run in scenario["arms"].values():
        assert set(run) >= SUMMARY_KEYS
        outcomes = run["outcomes"]
        assert outcomes["requests"] == requests  # the same trace for every strategy
        assert outcomes["errors"] == 0, outcomes
        assert outcomes["ok"] > 0
        assert set(run["ttft_ms"]) == {"p50", "p95", "p99", "mean", "max"}
        assert 0 < run["ttft_ms"]["p50"] <= run["latency_ms"]["p50"]
        assert sum(run["share"].values()) == pytest.approx(1.0)
        assert sum(b["started"] for b in run["backends"].values()) >= outcomes["ok"]
        assert run["prefix_cache_hit_rate"] > 0  # shared system prompts hit the caches
    rows = report["decision"]["rows"]
    assert {(r["backends"], r["strategy"]) for r in rows} == {
        (size, strategy)
        for size in (2, 8)
        for strategy in ("score", "least_inflight", "round_robin")
    }
    assert all(r["p50_us"] > 0 for r in rows)
    assert [t["id"] for t in report["targets"]] == [
        "hetero_p99_ttft",
        "uniform_p99_ttft",
        "uniform_p99_e2e",
        "prefix_affinity_gain",
        "decision_p99",
    ]
    assert "prefix:" in proc.stdout and "routing decision cost" in proc.stdout


def test_sim_host_serves_a_heterogeneous_pool() -> None:
    (hetero, *_) = routing_scenarios.scenarios(2.0)
    body = build_trace(TraceSpec(mix=((CHAT, 1.0),), rate=50.0, duration_s=0.5))[0].body
    body["max_tokens"] = 4
    with SimHost(hetero.backends, "127.0.0.1", sample_s=0.005) as host:
        assert set(host.apps) == {"vllm", "llamacpp"}
        for name, port in host.ports.items():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/v1/chat/completions", json.dumps(body))
            response = conn.getresponse()
            text = response.read().decode()
            conn.close()
            assert response.status == 200, (name, text)
            assert text.count("data: ") == body["max_tokens"] + 3  # role, tokens, end, [DONE]
        counters = host.counters()
        samples = host.loads["llamacpp"].samples
    assert [c["completed"] for c in counters.values()] == [1, 1]
    assert counters["llamacpp"]["prefix_cache_queries"] == 0  # caching off in this scenario
    # One request at a time: it may be sampled in `waiting` between its arrival and the
    # engine's next step (a race with the sampling thread), but nothing ever queues behind.
    assert samples and all(waiting <= 1 for _, _, waiting in samples)


def test_trace_is_seeded_and_shaped() -> None:
    spec = TraceSpec(mix=((CHAT, 3.0), (RAG, 1.0)), rate=200.0, duration_s=2.0, seed=4)
    trace = build_trace(spec)
    assert trace == build_trace(spec)
    assert trace != build_trace(dataclasses.replace(spec, seed=5))
    assert 300 < len(trace) < 500  # Poisson at 200/s for 2 s
    assert all(a.at < b.at for a, b in itertools.pairwise(trace))
    rag = [r for r in trace if r.workload == "rag"]
    assert 0.15 < len(rag) / len(trace) < 0.35
    body = rag[0].body
    assert body["stream"] is True
    assert body["max_tokens"] == 32  # 512 / 16
    system, user = body["messages"]
    assert len(system["content"]) == 4 * RAG.system_tokens  # 4 bytes a simulator token
    assert system["content"] in {r.body["messages"][0]["content"] for r in rag[1:]}  # shared
    assert len(user["content"]) > 4 * 1000


def test_bursty_arrivals_keep_the_rate() -> None:
    poisson = arrival_times(100.0, 50.0, 1.0, random.Random(1))
    bursty = arrival_times(100.0, 50.0, 0.25, random.Random(1))
    assert len(poisson) == pytest.approx(5000, rel=0.05)
    assert len(bursty) == pytest.approx(5000, rel=0.15)

    def cv(times: list[float]) -> float:
        gaps = [b - a for a, b in itertools.pairwise(times)]
        mean = sum(gaps) / len(gaps)
        return float((sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean)

    assert cv(poisson) == pytest.approx(1.0, abs=0.1)
    assert cv(bursty) == pytest.approx(2.0, abs=0.3)  # 1 / sqrt(shape)


def test_capacity_model() -> None:
    settings = SimSettings(
        slots=4,
        decode_tokens_per_s=10.0,
        batch_slowdown=0.5,
        prefill_tokens_per_s=1000.0,
        kv_capacity_tokens=100_000,
    )
    # 4 slots, 10 output tokens: 0.4 admissions per step of 0.25 s decode + 0.4 * 100 /
    # 1000 s prefill, 0.4 requests done per 0.29 s.
    assert routing_scenarios.capacity(settings, 100, 10) == pytest.approx(0.4 / 0.29)
    # A KV cache holding only two prompts limits the batch to two.
    small = dataclasses.replace(settings, kv_capacity_tokens=2 * 105)
    assert routing_scenarios.capacity(small, 100, 10) == pytest.approx(0.2 / (0.15 + 0.02))


def test_generated_gateway_config_is_valid() -> None:
    (hetero, *_) = routing_scenarios.scenarios(2.0)
    ports = {name: 9000 + i for i, (name, _) in enumerate(hetero.backends)}
    key_hash = "sha256:" + "0" * 64
    for arm in routing_scenarios.ARMS.values():
        text = routing.gateway_config(hetero, arm, ports, 8080, key_hash, 2.0)
        config = parse_config(text, env={})
        assert config.routing.default.strategy == arm.strategy
        assert config.routing.default.weights.affinity == arm.affinity
        assert config.scrape.interval_s == pytest.approx(0.5 / 32)
        slots = [b.capacity.max_concurrency for b in config.backends]
        assert slots == ([64, 4] if arm.declare_slots else [None, None])


def _row(ttft: float, latency: float, outcome: str, at: float = 0.0) -> list[Any]:
    return [ttft, latency, 10, outcome, 0.001, at, "chat"]


def test_summary_counts_cut_off_requests_as_lower_bounds() -> None:
    rows = [_row(0.1 * i, 1.0 + 0.1 * i, "ok", at=0.5 * i) for i in range(1, 10)]
    rows.append(_row(8.0, 8.0, "unfinished"))
    rows.append([None, None, 0, "status_503", 0.0, 1.0, "chat"])
    counters = {
        b: {"started": 5, "prefix_cache_queries": 100, "prefix_cache_hits": 25} for b in "ab"
    }
    loads = {"a": [(0.0, 2, 0), (0.1, 3, 4)], "b": [(0.0, 1, 1), (0.1, 1, 0)]}
    summary = summarize({"requests": rows}, counters, loads)
    assert summary["outcomes"] == {
        "requests": 11,
        "ok": 9,
        "unfinished": 1,
        "errors": 1,
        "error_kinds": {"status_503": 1},
    }
    assert summary["ttft_ms"]["max"] == pytest.approx(8000)  # the cut-off request counts
    assert summary["ttft_ms"]["p50"] == pytest.approx(500)
    assert summary["throughput"]["req_per_s"] == pytest.approx(9 / (4.5 + 1.9))
    assert summary["queued"]["mean"] == pytest.approx(2.5)
    assert summary["queued"]["max"] == 4
    assert summary["share"] == {"a": 0.5, "b": 0.5}
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.25)


def test_quantiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantiles(values, scale=1.0) == {
        "p50": 50.0,
        "p95": 95.0,
        "p99": 99.0,
        "mean": 50.5,
        "max": 100.0,
    }
    assert quantiles([]) == {}


def _arm(p50: float, p99: float, e2e_p99: float = 1000.0) -> dict[str, Any]:
    return {"ttft_ms": {"p50": p50, "p99": p99}, "latency_ms": {"p99": e2e_p99}}


def test_targets_and_render() -> None:
    report: dict[str, Any] = {
        "scenarios": {
            "hetero": {"arms": {"round_robin": _arm(100, 1000), "score": _arm(50, 400)}},
            "uniform": {
                "arms": {
                    "round_robin": _arm(50, 200, 990),
                    "least_inflight": _arm(50, 220),
                    "score": _arm(50, 230),
                }
            },
            "prefix": {"arms": {"score": _arm(90, 200), "score_no_affinity": _arm(100, 210)}},
        },
        "decision": {
            "calls": 10,
            "rows": [
                {"backends": 2, "strategy": "score", "p50_us": 4, "p99_us": 12, "max_us": 30},
                {"backends": 8, "strategy": "score", "p50_us": 9, "p99_us": 60, "max_us": 90},
            ],
        },
    }
    found = {t["id"]: (t["value"], t["met"]) for t in evaluate_targets(report)}
    assert found["hetero_p99_ttft"] == (pytest.approx(0.4), True)
    assert found["uniform_p99_ttft"] == (pytest.approx(1.15), False)
    assert found["uniform_p99_e2e"] == (pytest.approx(1000 / 990), True)
    assert found["prefix_affinity_gain"] == (pytest.approx(0.1), True)
    assert found["decision_p99"] == (60, False)
    text = render({"decision": report["decision"], "targets": evaluate_targets(report)})
    assert "MISS  uniform pool: score p99 TTFT" in text
    assert "PASS  heterogeneous pool" in text
    assert evaluate_targets({})[0]["met"] is None


def test_an_arm_that_refused_requests_is_no_figure() -> None:
    """Refused or broken requests are not in an arm's percentiles: a scorer that shed its
    slow requests with 503s would have a p99 TTFT a fraction of round robin's."""
    shed = {**_arm(50, 100), "outcomes": {"errors": 40, "ok": 60}}
    clean = {**_arm(100, 1000), "outcomes": {"errors": 0, "ok": 100}}
    report = {"scenarios": {"hetero": {"arms": {"round_robin": clean, "score": shed}}}}
    (hetero, *_) = evaluate_targets(report)
    assert hetero["id"] == "hetero_p99_ttft" and (hetero["value"], hetero["met"]) == (None, None)
    report["scenarios"]["hetero"]["arms"]["score"] = {**shed, "outcomes": {"errors": 0}}
    assert evaluate_targets(report)[0]["met"] is True
    report["scenarios"]["hetero"]["arms"] = {"round_robin": shed, "score": clean}
    assert evaluate_targets(report)[0]["met"] is None  # nor a baseline that shed requests
    # over several traces, one that shed requests leaves the target not measured
    good = {"round_robin": clean, "score": {**_arm(50, 100), "outcomes": {"errors": 0}}}
    traces = [
        evaluate_targets({"scenarios": {"hetero": {"arms": arms}}})
        for arms in (good, {"round_robin": clean, "score": shed}, good)
    ]
    combined = median_targets(traces)[0]
    assert combined["per_run"] == [pytest.approx(0.1), None, pytest.approx(0.1)]
    assert (combined["value"], combined["met"]) == (None, None)


def test_a_target_not_measured_says_why() -> None:
    """A target left without a figure names the arm whose requests were refused or broke
    (or the scenario that did not run), over one trace and over several: "not measured"
    is never printed without its reason."""
    shed = {**_arm(50, 100), "outcomes": {"errors": 40, "ok": 60}}
    clean = {**_arm(100, 1000), "outcomes": {"errors": 0, "ok": 100}}
    report = {"scenarios": {"hetero": {"arms": {"round_robin": clean, "score": shed}}}}
    targets = evaluate_targets(report)
    assert targets[0]["why_not_measured"] == "hetero: score had 40 refused or broken request(s)"
    assert targets[1]["why_not_measured"] == "uniform did not run"
    text = render({"targets": targets})
    assert (
        "SKIP  heterogeneous pool: score p99 TTFT / round robin's: not measured "
        "(hetero: score had 40 refused or broken request(s))"
    ) in text
    good = {"round_robin": clean, "score": {**_arm(50, 100), "outcomes": {"errors": 0}}}
    traces = [
        evaluate_targets({"scenarios": {"hetero": {"arms": arms}}})
        for arms in (good, {"round_robin": clean, "score": shed}, good)
    ]
    combined = median_targets(traces)[0]
    assert combined["met"] is None
    assert combined["why_not_measured"] == (
        "trace 2: hetero: score had 40 refused or broken request(s)"
    )
    assert median_targets([traces[0], traces[2]])[0]["why_not_measured"] is None  # measured


def test_several_traces_are_judged_by_their_median() -> None:
    def runs(*p99s: float) -> list[list[dict[str, Any]]]:
        return [
            evaluate_targets(
                {
                    "scenarios": {
                        "uniform": {
                            "arms": {
                                "round_robin": _arm(50, 200),
                                "least_inflight": _arm(50, 220),
                                "score": _arm(50, p99),
                            }
                        }
                    }
                }
            )
            for p99 in p99s
        ]

    # One bad trace out of three does not decide; two do.
    uniform = {t["id"]: t for t in median_targets(runs(180, 300, 205))}["uniform_p99_ttft"]
    assert (uniform["value"], uniform["met"]) == (pytest.approx(1.025), True)
    assert uniform["per_run"] == [pytest.approx(1.0), pytest.approx(1.5), pytest.approx(1.025)]
    worse = {t["id"]: t for t in median_targets(runs(180, 300, 240))}["uniform_p99_ttft"]
    assert worse["met"] is False
    even = {t["id"]: t for t in median_targets(runs(200, 220))}["uniform_p99_ttft"]
    assert even["value"] == pytest.approx(1.05)
    assert "median of 1.000 / 1.100" in render({"targets": median_targets(runs(200, 220))})
    single = median_targets(runs(200))
    assert "per_run" not in single[1] and single[1]["value"] == pytest.approx(1.0)
    assert single[0]["value"] is None  # the hetero pool did not run: not measured


def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    routing.add_arguments(parser)
    bad = (["--scenarios", "nope"], ["--arms", "fastest"], ["--load", "0"], ["--seeds", "0"])
    for flags in bad:
        assert routing.run(parser.parse_args(flags)) == 2
    assert "--scenarios takes names of" in capsys.readouterr().err
