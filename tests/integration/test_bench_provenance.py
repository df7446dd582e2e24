"""`owngate bench provenance --quick` end to end over real processes: report shape only.

Timing is never asserted (the machine is shared); only that every point ran against the
gateway with the log off and on without errors, on both simulator shapes, that the `on`
gateways wrote logs that verify, and that the ratios were computed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from owngate_bench.provenance_report import on_off_ratios, render, render_verdicts, verdicts
from owngate_bench.services import histogram_quantile
from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.bench


def test_quick_run_writes_the_side_by_side_report(tmp_path: Path) -> None:
    out = tmp_path / "provenance.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OWNGATE_BENCH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "provenance", "--quick", "--json", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # a quick run takes ~30 s on a busy 2-core machine; this bounds a hang
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())

    assert report["schema"] == "owngate.bench.provenance/1"
    assert [(p["backend"], p["concurrency"]) for p in report["points"]] == [
        ("zero-latency", 16),
        ("zero-latency", 64),
        ("llm-shaped", 16),
        ("llm-shaped", 64),
        ("llm-varied", 16),
        ("llm-varied", 64),
    ]
    for index, point in enumerate(report["points"]):
        # off and on trade places from point to point: neither is always measured first
        assert point["order"] == (["on", "off"] if index % 2 else ["off", "on"])
        for mode, result in point["results"].items():
            where = f"{point['backend']} c={point['concurrency']} {mode}"
            assert result["requests"] > 0, where
            assert result["errors"] == 0, (where, result["error_samples"])
            assert result["ttft_ms"]["p99"] >= result["ttft_ms"]["p50"] > 0, where
            assert result["cpu_s"]["gateway"] > 0, where
        assert set(point["ratios"]) >= {"req_per_s", "ttft_p50_ms", "cpu_ms_per_req"}
    assert set(report["logs"]) == {"zero-latency", "llm-shaped", "llm-varied"}
    assert all(text.startswith("verified") for text in report["logs"].values())
    assert "zero-latency  16" in render(report)
    assert [(v["backend"], v["concurrency"], v["runs"]) for v in report["verdicts"]] == [
        (p["backend"], p["concurrency"], 1) for p in report["points"]
    ]
    assert "targets (median over each point's runs)" in render(report)
    on = report["points"][0]["results"]["on"]
    assert on["dispatch_wait_ms"]["p99"] >= on["dispatch_wait_ms"]["p50"] > 0


def test_histogram_quantile_interpolates_inside_the_bucket_of_the_delta() -> None:
    inf = float("inf")
    before = {0.001: 5.0, 0.002: 5.0, 0.004: 5.0, inf: 5.0}  # observed before the run
    after = {0.001: 5.0, 0.002: 9.0, 0.004: 13.0, inf: 15.0}  # 10 more: 4, 4 and 2
    assert histogram_quantile(before, after, 0.2) == pytest.approx(0.0015)  # half of (1, 2]
    assert histogram_quantile(before, after, 0.6) == pytest.approx(0.003)  # half of (2, 4]
    assert histogram_quantile(before, after, 0.99) == 0.004  # in +Inf: the top finite bound
    assert histogram_quantile(after, after, 0.5) is None  # nothing new was observed
    assert histogram_quantile({}, {}, 0.5) is None


def _point(backend: str, c: int, repeat: int, ratio: float | None, added: float | None) -> Any:
    ratios = {} if ratio is None else {"req_per_s": ratio, "added_ttft_p50_ms": added}
    return {"backend": backend, "concurrency": c, "repeat": repeat, "ratios": ratios}


def test_verdicts_take_the_median_of_each_points_runs() -> None:
    points = [
        _point("llm-shaped", 64, 0, 1.00, 9.0),
        _point("llm-shaped", 64, 1, 0.99, -1.2),
        _point("llm-shaped", 64, 2, 1.00, 4.0),
        _point("zero-latency", 16, 0, 0.50, 2.9),
        _point("zero-latency", 16, 1, 0.86, 1.9),
        _point("zero-latency", 16, 2, 0.90, 1.0),
        _point("llm-varied", 16, 0, None, None),  # a failed run has no ratios
    ]
    found = {(v["backend"], v["concurrency"]): v for v in verdicts(points)}
    lockstep = found[("llm-shaped", 64)]
    assert (lockstep["runs"], lockstep["added_ttft_p50_ms"]) == (3, 4.0)
    assert (lockstep["throughput_met"], lockstep["ttft_met"]) == (True, False)
    cpu_bound = found[("zero-latency", 16)]
    assert (cpu_bound["throughput_ratio"], cpu_bound["added_ttft_p50_ms"]) == (0.86, 1.9)
    assert (cpu_bound["throughput_met"], cpu_bound["ttft_met"]) == (True, True)
    failed = found[("llm-varied", 16)]
    assert (failed["throughput_met"], failed["ttft_met"]) == (None, None)
    text = "\n".join(render_verdicts(verdicts(points)))
    assert "llm-shaped    c=64  req/s 1.00x (met); TTFT p50 +4.00 ms (MISSED)" in text
    assert "[runs: +9.00, -1.20, +4.00]" in text
    assert "llm-varied    c=16  req/s -x (no figure)" in text


def test_provenance_verdicts_agree_with_the_figures_they_print() -> None:
    """A ratio of 0.8496 misses 0.85: printed "0.85x" it would read as met."""
    found = verdicts([_point("zero-latency", 16, 0, 0.8496, 2.004)])
    assert (found[0]["throughput_met"], found[0]["ttft_met"]) == (False, False)
    text = "\n".join(render_verdicts(found))
    assert "req/s 0.8496x (MISSED); TTFT p50 +2.004 ms (MISSED)" in text


def test_a_side_with_errors_gives_no_ratio() -> None:
    """The log "on" answering half its requests with errors would serve the rest faster:
    no ratio, so no verdict is met on it."""

    def cell(rps: float, errors: int = 0) -> dict[str, Any]:
        return {
            "requests": 100,
            "errors": errors,
            "req_per_s": rps,
            "ttft_ms": {"p50": 1.0, "p99": 2.0},
            "cpu_s": {"gateway": 0.01},
        }

    assert on_off_ratios({"off": cell(100), "on": cell(95)})["req_per_s"] == 0.95
    assert on_off_ratios({"off": cell(100), "on": cell(95, errors=50)}) == {}
    assert on_off_ratios({"off": cell(100, errors=1), "on": cell(95)}) == {}
    found = verdicts([{"backend": "zero-latency", "concurrency": 16, "ratios": {}}])
    assert found[0]["throughput_met"] is None and found[0]["ttft_met"] is None


def test_a_point_with_a_run_that_had_no_ratio_gets_no_verdict() -> None:
    """Three runs of a point, one of which failed or answered with errors (no ratio): the
    median of the two that went well is not the point's median, and "met" on it would
    hide the failed run."""
    points = [
        _point("zero-latency", 16, 0, 0.90, 1.0),
        _point("zero-latency", 16, 1, None, None),
        _point("zero-latency", 16, 2, 0.95, 1.5),
    ]
    (found,) = verdicts(points)
    assert found["runs"] == 3
    assert (found["throughput_met"], found["ttft_met"]) == (None, None)
    text = "\n".join(render_verdicts([found]))
    assert "req/s -x (no figure); TTFT p50 - ms (no figure)" in text
    # the reason is stated, not only "no figure"
    assert (
        found["why_not_measured"]
        == "1 of 3 run(s) had no ratio (a side failed or answered with errors)"
    )
    assert text.endswith(
        "; no figure: 1 of 3 run(s) had no ratio (a side failed or answered with errors)"
    )
    (clean,) = verdicts([points[0], points[2]])
    assert clean["why_not_measured"] is None and clean["throughput_met"] is True
