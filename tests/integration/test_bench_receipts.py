"""`owngate bench receipts --quick` end to end over real processes: report shape only.

Timing is never asserted (the machine is shared); only that every point ran against the
gateway issuing single (v1) and batch (v2) receipts without errors, that a receipt of
each verified, that both logs verify, and that sealing was measured alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.bench


def test_quick_run_writes_the_side_by_side_report(tmp_path: Path) -> None:
    out = tmp_path / "receipts.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OWNGATE_BENCH_")}
    argv = ["bench", "receipts", "--quick", "--duration", "0.3", "--repeat", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *argv, "--concurrency", "1,4", "--json", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # ~20 s on a busy 2-core machine; this bounds a hang
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert [(p["concurrency"], p["order"]) for p in report["points"]] == [
        (1, ["single", "batch"]),
        (4, ["batch", "single"]),  # the modes trade places from point to point
    ]
    for point in report["points"]:
        for mode in ("single", "batch"):
            assert point[mode]["cpu_ms_per_req"] > 0 and not point[mode]["errors"], point
    checks = report["checks"]
    # the receipts of requests sent together: the batch gateway's include batch receipts
    # (v2), so the run verifies that form too, not only a lone request's v1
    assert re.search(r"\b0 v2 \(batch\)", checks["single"]), checks["single"]
    assert checks["single"].endswith("verified")
    assert re.search(r"\b[1-9]\d* v2 \(batch\)", checks["batch"]), checks["batch"]
    assert checks["batch"].endswith("verified")
    assert checks["log single"].startswith("verified") and checks["log batch"].startswith(
        "verified"
    )
    sealing = {(row["concurrency"], row["mode"]) for row in report["sealing"]}
    assert sealing == {(c, m) for c in (1, 4) for m in ("single", "batch")}
    assert all(row["us_per_receipt"] > 0 for row in report["sealing"])
    assert "sealing alone" in proc.stdout


def test_a_run_with_errors_is_no_figure_in_the_medians() -> None:
    """A batch gateway answering half its requests with errors spends less CPU per
    request counted: its figure must not enter the medians or the batch/single ratio."""
    from owngate_bench.receipts import _cpu_ms, _medians

    def result(cpu_s: float, errors: int = 0) -> dict[str, Any]:
        return {"requests": 100, "errors": errors, "req_per_s": 1000.0, "cpu_s": {"gateway": cpu_s}}

    assert _cpu_ms(result(0.05)) == pytest.approx(0.5)
    assert _cpu_ms(result(0.01, errors=50)) is None
    rows = [
        {
            "concurrency": 16,
            "single": {"req_per_s": 1000.0, "cpu_ms_per_req": _cpu_ms(result(0.05))},
            "batch": {"req_per_s": 1000.0, "cpu_ms_per_req": _cpu_ms(result(cpu))},
        }
        for cpu in (0.04, 0.04)
    ]
    rows.append(
        {
            "concurrency": 16,
            "single": {"req_per_s": 1000.0, "cpu_ms_per_req": _cpu_ms(result(0.05))},
            "batch": {"req_per_s": 1000.0, "cpu_ms_per_req": _cpu_ms(result(0.001, errors=90))},
        }
    )
    (entry,) = _medians(rows, [16])
    assert entry["batch_cpu_ms_per_req"] == pytest.approx(0.4)
    assert entry["cpu_ratio_batch_over_single"] == pytest.approx(0.8)
