"""`owngate bench attest --quick` end to end over real processes: report shape only.

Timing is never asserted (the machine is shared): only that every target answered
without errors, that the sidecar's CPU per request and the added p50 were computed, and
that the attested gateway's log passed the two-party audit against its sidecar's log.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from owngate_bench import attest
from owngate_bench.attest import TARGETS
from owngate_bench.attest_report import figures, render
from tests.helpers.paths import REPO_ROOT
from tests.helpers.prerequisites import real_backend

pytestmark = pytest.mark.bench


def test_quick_run_reports_every_target_side_by_side() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "attest", "--quick", "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,  # ~20 s on a busy 2-core machine; this bounds a hang
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["audit"] is None
    assert set(report["targets"]) == set(TARGETS)
    for target, row in report["targets"].items():
        assert row["requests"] > 0 and row["errors"] == 0, target
        has_sidecar = target in ("sidecar", "gateway+sidecar")
        assert (row["sidecar_cpu_us_per_req"] is not None) == has_sidecar, target
    assert set(report["added_p50_ms"]) == {"sidecar", "gateway+sidecar"}
    assert all(value is not None for value in report["added_p50_ms"].values())


def _bench_attest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "attest", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # llama-server's start and four targets; this bounds a hang
        check=False,
    )


def test_a_real_backend_run_needs_an_installed_llama_server(tmp_path: Path) -> None:
    proc = _bench_attest("--backend", "real", "--real-dir", str(tmp_path), "--quick")
    assert proc.returncode == 2
    assert f"no llama-server in {tmp_path}/bin" in proc.stderr


@pytest.mark.real_backend
def test_quick_run_in_front_of_a_real_llama_server() -> None:
    root = real_backend().root
    proc = _bench_attest("--backend", "real", "--real-dir", str(root), "--quick", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["backend"] == "real" and report["audit"] is None
    for target, row in report["targets"].items():
        assert row["requests"] > 0 and row["errors"] == 0, target


def test_each_target_of_the_issue_gets_a_verdict_line() -> None:
    def row(cpu: float | None) -> dict[str, object]:
        return {"requests": 10, "p50_ms": 1.0, "p99_ms": 2.0, "sidecar_cpu_us_per_req": cpu}

    report = {
        "concurrency": 1,
        "stream": False,
        "backend_name": "zero-latency simulator",
        "machine_busy": 0.5,
        "targets": {"direct": row(None), "sidecar": row(95.0), "gateway+sidecar": row(140.0)},
        "added_p50_ms": {"sidecar": 0.2, "gateway+sidecar": None},
        "audit": None,
    }
    lines = render(report).splitlines()
    assert any(line.strip().startswith("met") and "(sidecar): +0.200 ms" in line for line in lines)
    assert any(line.strip().startswith("n/a") and "(gateway+sidecar): -" in line for line in lines)
    cpu = [line.strip() for line in lines if "sidecar CPU per request" in line]
    assert cpu[0].startswith("met") and "95 µs" in cpu[0]
    assert cpu[1].startswith("NOT MET") and "140 µs" in cpu[1]


def test_attest_verdicts_agree_with_the_figures_they_print() -> None:
    """20 ticks over 2,000 requests is 100 µs, the target; 100.4 µs is over it."""

    def row(cpu: float | None) -> dict[str, object]:
        return {"requests": 2000, "p50_ms": 1.0, "p99_ms": 2.0, "sidecar_cpu_us_per_req": cpu}

    on_target = 1e6 * (5.2 - 5.0) / 2000
    report = {
        "concurrency": 1,
        "stream": False,
        "backend_name": "zero-latency simulator",
        "machine_busy": 0.5,
        "targets": {"direct": row(None), "sidecar": row(on_target), "gateway+sidecar": row(100.4)},
        "added_p50_ms": {"sidecar": 0.3004, "gateway+sidecar": 0.1},
        "audit": None,
    }
    lines = [line.strip() for line in render(report).splitlines()]
    added = next(line for line in lines if "added by the sidecar (sidecar)" in line)
    assert added.startswith("NOT MET") and "+0.3004 ms" in added
    cpu = [line for line in lines if "sidecar CPU per request" in line]
    assert cpu[0].startswith("met") and "100 µs" in cpu[0]
    assert cpu[1].startswith("NOT MET") and "100.4 µs" in cpu[1]


def test_a_target_with_errors_gets_no_verdict() -> None:
    """A sidecar that fails half its requests answers the rest no slower: never "met"."""

    def result(p50: float, errors: int = 0) -> dict[str, object]:
        return {
            "requests": 100,
            "errors": errors,
            "latency_ms": {"p50": p50, "p99": 2 * p50},
            "cpu_s": {"sidecar": 0.005},
        }

    found = figures({"direct": result(0.1), "sidecar": result(0.2, errors=50)})
    assert found["added_p50_ms"]["sidecar"] is None
    report = {
        "concurrency": 1,
        "stream": False,
        "backend_name": "zero-latency simulator",
        "machine_busy": 0.5,
        **found,
        "audit": None,
    }
    lines = [line.strip() for line in render(report).splitlines()]
    assert not any(line.startswith("met") for line in lines), lines
    cpu = next(line for line in lines if "sidecar CPU per request (sidecar)" in line)
    assert cpu.startswith("n/a")
    assert cpu.endswith(": not measured, sidecar answered 50 request(s) with errors"), cpu
    added = next(line for line in lines if "p50 added by the sidecar (sidecar)" in line)
    assert added.startswith("n/a"), added
    assert added.endswith(": not measured, sidecar answered 50 request(s) with errors"), added
    clean = figures({"direct": result(0.1), "sidecar": result(0.2)})
    assert abs(clean["added_p50_ms"]["sidecar"] - 0.1) < 1e-9


def test_figures_are_medians_of_interleaved_repetitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each repetition runs every target, the order rotated (direct is not always first,
    so the sidecar is not always measured after it); the added p50 is the median of each
    repetition's own difference, not one window each nor medians subtracted."""
    order: list[str] = []

    def measure_one(_services: object, _key: str, _args: object, target: str) -> dict[str, object]:
        order.append(target)
        return {"target": target}

    monkeypatch.setattr(attest, "_measure_one", measure_one)
    args = argparse.Namespace(reps=None, quick=False)
    reps = attest._measure({}, "sk", args)
    assert len(reps) == 3 and all(set(rep) == set(TARGETS) for rep in reps)
    assert [order[i * len(TARGETS)] for i in range(3)] == list(TARGETS[:3])
    assert len(attest._measure({}, "sk", argparse.Namespace(reps=None, quick=True))) == 1

    def result(p50: float, errors: int = 0) -> dict[str, object]:
        return {
            "requests": 100,
            "errors": errors,
            "latency_ms": {"p50": p50, "p99": 2 * p50},
            "cpu_s": {"sidecar": 0.01},
        }

    # sidecar - direct per repetition: 0.1, 0.5, 0.2 (median 0.2); medians subtracted: 0.1
    runs = [
        {"direct": result(1.0), "sidecar": result(1.1)},
        {"direct": result(0.5), "sidecar": result(1.0)},
        {"direct": result(2.0), "sidecar": result(2.2)},
    ]
    found = figures(runs)
    assert found["reps"] == 3
    assert found["added_p50_ms"]["sidecar"] == pytest.approx(0.2)
    assert found["targets"]["sidecar"]["p50_ms"] == pytest.approx(1.1)
    assert found["targets"]["sidecar"]["requests"] == 300
    runs[1]["sidecar"] = result(1.0, errors=3)  # errors in one repetition: no figure
    assert figures(runs)["added_p50_ms"]["sidecar"] is None
    runs[1]["sidecar"] = {"error": "loadgen exited 1"}  # a failed repetition: failed
    assert figures(runs)["targets"]["sidecar"] is None
    report = {
        "concurrency": 1,
        "stream": False,
        "backend_name": "zero-latency simulator",
        "machine_busy": 0.5,
        **figures(runs),
        "audit": None,
    }
    lines = [line.strip() for line in render(report).splitlines()]
    assert "(sidecar): - (target <= 0.3 ms): not measured, sidecar failed in a repetition" in (
        "\n".join(lines)
    )
