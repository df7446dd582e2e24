"""`owngate bench attest --quick` end to end over real processes: report shape only.

Timing is never asserted (the machine is shared): only that every target answered
without errors, that the sidecar's CPU per request and the added p50 were computed, and
that the attested gateway's log passed the two-party audit against its sidecar's log.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from owngate_bench.attest import TARGETS
from tests.helpers.paths import REPO_ROOT

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
