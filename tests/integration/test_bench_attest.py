"""`owngate bench attest --quick` end to end over real processes: report shape only.

Timing is never asserted (the machine is shared): only that every target answered
without errors, that the sidecar's CPU per request and the added p50 were computed, and
that the attested gateway's log passed the two-party audit against its sidecar's log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from owngate_bench.attest import TARGETS
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
