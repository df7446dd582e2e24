"""The overhead benchmark end to end: a `--quick` run over real processes, JSON shape only.

Timing is never asserted (CI machines are shared); only that every load point ran against
the simulator and owngate without errors and that the report has its documented shape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.bench.report import evaluate_checks

ROOT = Path(__file__).resolve().parent.parent

CHECK_IDS = [
    "added_p50_c1",
    "chat_req_per_s",
    "stream_chunks_per_s",
    "vs_litellm_chat",
    "vs_litellm_stream",
]


def test_quick_run_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OWNGATE_BENCH_")}
    proc = subprocess.run(
        [sys.executable, "bench/overhead.py", "--quick", "--skip-litellm", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,  # a quick run takes ~10 s; this only bounds a hang
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())

    assert report["schema"] == "owngate.bench.overhead/1"
    assert report["settings"]["targets"] == ["direct", "owngate"]
    assert report["machine"]["cpu_count"] >= 1
    assert set(report["targets"]) == {"direct", "owngate"}
    assert [(p["stream"], p["concurrency"]) for p in report["points"]] == [
        (False, 1),
        (False, 16),
        (False, 64),
        (True, 16),
        (True, 64),
    ]
    for point in report["points"]:
        assert set(point["results"]) == {"direct", "owngate"}
        for target, result in point["results"].items():
            where = f"{point['name']} {target}"
            assert result["requests"] > 0, where
            assert result["errors"] == 0, (where, result["error_samples"])
            assert result["latency_ms"]["p50"] > 0, where
            expected_cpu = {"target", "machine"} | ({"sim"} if target == "owngate" else set())
            assert set(result["cpu_s"]) == expected_cpu, where
            if point["stream"]:
                assert result["chunks"] >= 64 * result["requests"], where
                assert result["ttft_ms"]["p99"] >= result["ttft_ms"]["p50"] > 0, where
    checks = {c["id"]: c for c in report["checks"]}
    assert list(checks) == CHECK_IDS
    assert checks["chat_req_per_s"]["measured"] > 0
    assert checks["vs_litellm_chat"]["passed"] is None  # LiteLLM was skipped
    assert "og/litellm" in proc.stdout
    assert "added latency p50 ms" in proc.stdout


def _point(stream: bool, concurrency: int, **results: dict[str, Any]) -> dict[str, Any]:
    return {"name": "p", "stream": stream, "concurrency": concurrency, "results": results}


def test_checks_compare_best_points_and_report_margins() -> None:
    def chat(rps: float, p50: float) -> dict[str, Any]:
        return {"requests": 10, "req_per_s": rps, "latency_ms": {"p50": p50}}

    def stream(chunks: float) -> dict[str, Any]:
        return {"requests": 10, "req_per_s": 1.0, "chunks_per_s": chunks}

    points = [
        _point(False, 1, direct=chat(9000, 0.2), owngate=chat(1500, 0.7), litellm=chat(90, 10)),
        _point(False, 64, direct=chat(9000, 5), owngate=chat(2500, 20), litellm=chat(110, 500)),
        _point(True, 16, owngate=stream(60000), litellm={"error": "did not start"}),
    ]
    checks = {c["id"]: c for c in evaluate_checks(points)}
    assert abs(checks["added_p50_c1"]["measured"] - 0.5) < 1e-9
    assert checks["added_p50_c1"]["passed"] is True
    assert checks["chat_req_per_s"]["measured"] == 2500
    assert checks["vs_litellm_chat"]["measured"] == 2500 / 110
    assert checks["vs_litellm_chat"]["passed"] is True
    assert checks["stream_chunks_per_s"]["passed"] is True
    assert checks["vs_litellm_stream"]["passed"] is None  # LiteLLM failed: not measured
