"""The workloads benchmark: a `--quick` run over the GH200-class simulator end to end,
and its parts (the vLLM-compatible client's summary, ratios, verdicts) on fixed data.

Timing is never asserted: the end-to-end run checks that every target answered every
request, that the report has its documented shape, and that the gateways' CPU and the
ratios were measured.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.config import load_config
from owngate_bench.workloads import wrong_answers
from owngate_bench.workloads_client import ClientSpec, Result, prompt_text, summarize
from owngate_bench.workloads_report import compare
from owngate_bench.workloads_routing import verdict as routing_verdict
from owngate_bench.workloads_targets import TARGETS, Backend, gateway_config
from tests.helpers.paths import REPO_ROOT
from tests.helpers.prerequisites import real_smollm2

pytestmark = pytest.mark.bench

VLLM_KEYS = {
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(
        f"{s}_{m}_ms"
        for s in ("mean", "median", "std", "p99")
        for m in ("ttft", "tpot", "itl", "e2el")
    ),
}


def test_quick_run_over_the_gh200_simulator(tmp_path: Path) -> None:
    out = tmp_path / "workloads.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OWNGATE_BENCH_")}
    argv = ["bench", "workloads", "--backend", "sim-gh200", "--quick", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # this run takes ~25 s; the timeout only bounds a hang
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["backend"] == "sim-gh200" and report["reps"] == 2
    assert [s["name"] for s in report["suites"]] == ["chat", "sweep-8"]
    for suite in report["suites"]:
        assert set(suite["targets"]) == set(TARGETS)
        for run in suite["runs"]:
            for summary in run.values():
                assert set(summary) >= VLLM_KEYS
                assert (
                    summary["failed"] == 0 and summary["completed"] == suite["shape"]["num_prompts"]
                )
        for target in ("owngate", "owngate+production"):
            row = suite["targets"][target]
            assert row["gateway_cpu_ms_per_request"] > 0
            assert {"median_ttft_ms", "median_itl_ms", "output_throughput"} <= set(row["ratios"])
            assert row["verdict"]
    assert "verdict owngate+production:" in proc.stdout


@pytest.mark.real_backend
def test_quick_run_through_a_real_llama_server_with_smollm2(tmp_path: Path) -> None:
    """The issue's suites through a real llama-server serving SmolLM2 (the model setup.sh
    probed answers "Paris"), direct and through both gateways: every request answered,
    ratios and a verdict per gateway, none of them "not measured"."""
    installation = real_smollm2()
    assert installation.smollm2_model is not None
    out = tmp_path / "workloads.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OWNGATE_BENCH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "workloads", "--quick", "--json", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,  # ~70 s on a busy 2-core machine; the timeout only bounds a hang
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["backend"] == "llamacpp"
    assert Path(report["backend_detail"]["model"]).name == installation.smollm2_model.name
    assert [s["name"] for s in report["suites"]] == ["chat", "sweep-0.5"]
    # asked before measuring, as the run serves the model: direct and through each gateway
    assert set(report["known_answer"]) == set(TARGETS)
    assert all("paris" in answer.lower() for answer in report["known_answer"].values())
    assert "the known question" in proc.stdout
    for suite in report["suites"]:
        for run in suite["runs"]:
            assert set(run) == set(TARGETS)
            for summary in run.values():
                assert summary["failed"] == 0, summary
                assert summary["completed"] == suite["shape"]["num_prompts"]
                assert summary["total_output_tokens"] > 0
        for target in ("owngate", "owngate+production"):
            row = suite["targets"][target]
            assert {"median_ttft_ms", "median_itl_ms", "output_throughput"} <= set(row["ratios"])
            assert row["verdict"] and not row["verdict"].startswith("not measured")


def test_a_target_whose_answer_lacks_the_known_one_is_named() -> None:
    answers = {
        "direct": "The capital of France is Paris.",
        "owngate": "L'Étoile, la Marseillaise, la femme au roi, la",
        "owngate+production": "failed: HTTP Error 503: Service Unavailable",
    }
    assert wrong_answers(answers) == ["owngate", "owngate+production"]


def test_prompts_are_fresh_and_about_the_asked_length() -> None:
    rng = random.Random(1)
    first, second = prompt_text(100, rng), prompt_text(100, rng)
    assert first.split()[0] != second.split()[0]  # no shared cached prefix
    assert len(first.split()) == 97


def test_spec_round_trips_an_infinite_rate() -> None:
    spec = ClientSpec("127.0.0.1", 1, "m", 10, 5, 2, math.inf, 1, seed=3, arrival_seed=4)
    assert ClientSpec.from_json(spec.to_json()) == spec


def test_summary_uses_vllms_definitions() -> None:
    results = [
        Result(ok=True, ttft=0.1, e2el=1.1, itl=[0.2, 0.3], prompt_tokens=10, output_tokens=3),
        Result(ok=True, ttft=0.3, e2el=0.7, itl=[0.1, 0.1], prompt_tokens=20, output_tokens=3),
        Result(error="status 500"),
    ]
    summary = summarize(results, duration_s=2.0)
    assert set(summary) >= VLLM_KEYS
    assert (summary["completed"], summary["failed"]) == (2, 1)
    assert summary["total_output_tokens"] == 6 and summary["output_throughput"] == 3.0
    assert summary["total_token_throughput"] == 18.0
    assert summary["median_ttft_ms"] == pytest.approx(200.0)
    assert summary["mean_tpot_ms"] == pytest.approx((500.0 + 200.0) / 2)  # (E2EL-TTFT)/(n-1)
    assert summary["mean_itl_ms"] == pytest.approx(175.0)
    assert summary["p99_itl_ms"] == pytest.approx(300.0)


def _summary(
    ttft: float, itl: float, throughput: float, cpu: float | None = None
) -> dict[str, Any]:
    found: dict[str, Any] = {
        "completed": 4,
        "failed": 0,
        "total_output_tokens": 400,
        "median_ttft_ms": ttft,
        "p99_ttft_ms": ttft * 2,
        "median_itl_ms": itl,
        "p99_itl_ms": itl * 2,
        "output_throughput": throughput,
    }
    if cpu is not None:
        found.update(gateway_cpu_s=cpu, gateway_idle_cores=0.01)
    return found


def test_ratios_are_paired_per_repetition_and_noise_covers_one() -> None:
    runs = [
        {"direct": _summary(100, 10, 50), "owngate": _summary(105, 10.2, 49, cpu=0.02)},
        {"direct": _summary(120, 11, 45), "owngate": _summary(110, 10.9, 46, cpu=0.02)},
        {"direct": _summary(100, 10, 50), "owngate": _summary(101, 9.9, 50, cpu=0.02)},
    ]
    row = compare(runs, ("direct", "owngate"))["owngate"]
    assert row["ratios"]["median_ttft_ms"]["median"] == pytest.approx(1.01)
    assert row["ratios"]["median_ttft_ms"]["min"] == pytest.approx(110 / 120)
    assert row["gateway_cpu_ms_per_request"] == pytest.approx(0.06 / 12 * 1e3)
    assert row["verdict"].startswith("within noise")


def test_a_consistent_slowdown_is_named() -> None:
    runs = [
        {"direct": _summary(100, 10, 50), "owngate": _summary(150, 10, 50, cpu=0.0)},
        {"direct": _summary(100, 10, 50), "owngate": _summary(140, 10, 50, cpu=0.0)},
    ]
    verdict = compare(runs, ("direct", "owngate"))["owngate"]["verdict"]
    assert "outside noise" in verdict and "TTFT p50 worse (1.45x)" in verdict
    assert "ITL" not in verdict and "tok/s" not in verdict


def test_a_gateway_that_failed_is_never_within_noise() -> None:
    """A gateway that completed nothing has no ratios: no ratio moved, but nothing was
    measured either; one whose requests partly failed is no verdict either."""
    down = {**_summary(0, 0, 0), "completed": 0, "failed": 2}
    runs = [{"direct": _summary(100, 10, 50), "owngate": down} for _ in range(3)]
    verdict = compare(runs, ("direct", "owngate"))["owngate"]["verdict"]
    assert verdict.startswith("not measured") and "6 of its requests failed" in verdict
    partly = {**_summary(101, 10, 50), "failed": 1}
    runs = [{"direct": _summary(100, 10, 50), "owngate": partly} for _ in range(3)]
    verdict = compare(runs, ("direct", "owngate"))["owngate"]["verdict"]
    assert verdict == "not measured: 3 of its requests failed"
    direct_down = {**_summary(0, 0, 0), "completed": 0}
    runs = [{"direct": direct_down, "owngate": _summary(100, 10, 50)} for _ in range(3)]
    verdict = compare(runs, ("direct", "owngate"))["owngate"]["verdict"]
    assert verdict.startswith("not measured: no repetition completed for TTFT p50")


def test_ratios_to_a_direct_run_whose_requests_failed_are_never_a_verdict() -> None:
    """Requests that failed direct leave the baseline to the survivors (fewer tokens, a
    lower throughput): the gateway's ratios to it are no yardstick, "within noise" or
    "better" alike."""
    partly = {**_summary(100, 10, 25), "failed": 2}
    runs = [{"direct": partly, "owngate": _summary(101, 10, 50, cpu=0.02)} for _ in range(3)]
    verdict = compare(runs, ("direct", "owngate"))["owngate"]["verdict"]
    assert verdict == "not measured: 6 of direct's requests failed (no baseline)"
    runs[1]["direct"] = _summary(100, 10, 50)  # one clean repetition is not enough either
    verdict = compare(runs, ("direct", "owngate"))["owngate"]["verdict"]
    assert verdict == "not measured: 4 of direct's requests failed (no baseline)"


def test_routing_verdict_needs_separated_ranges() -> None:
    assert routing_verdict({"score": [1.0, 2.0], "round_robin": [1.5, 3.0]}).startswith(
        "no strategy won"
    )
    assert routing_verdict({"score": [1.0, 1.2], "round_robin": [1.5, 3.0]}).startswith("score won")


def test_routing_verdict_is_not_judged_when_requests_failed() -> None:
    """Failed requests leave the p99 to the survivors: a strategy that shed its slow
    requests would look fastest."""
    p99s = {"score": [1.0, 1.2], "round_robin": [1.5, 3.0]}
    found = routing_verdict(p99s, {"score": 3, "round_robin": 0})
    assert found == "not judged: requests failed (3 under score)"
    assert routing_verdict(p99s, {"score": 0, "round_robin": 0}).startswith("score won")


@pytest.mark.parametrize("strategy", ["score", "round_robin"])
def test_gateway_configs_are_valid_and_say_what_they_name(tmp_path: Path, strategy: str) -> None:
    backends = [Backend("llamacpp", 9001, {}), Backend("llamacpp", 9002, {})]
    plain_path, plain_env = gateway_config(tmp_path, "owngate", backends, 8080, "k", strategy)
    plain = load_config(plain_path, env=plain_env)
    assert [b.kind for b in plain.backends] == ["llamacpp", "llamacpp"]
    assert plain.routing.default.strategy == strategy
    assert plain.provenance is None and plain.policy is None
    production_path, env = gateway_config(
        tmp_path, "owngate+production", backends[:1], 8081, "k", strategy
    )
    production = load_config(production_path, env=env)
    assert production.provenance is not None and production.policy is not None
    assert production.backends[0].kind == "llamacpp"
    assert production.backends[0].base_url == "http://127.0.0.1:9001"
    assert production.routing.default.strategy == strategy
