"""`owngate bench provenance-log --quick` runs and reports every figure (timings are never
asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench


def test_quick_benchmark_reports_every_figure(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "provenance-log", "--quick", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=tmp_path,
    )
    report = json.loads(result.stdout)
    assert set(report) == {"fsync", "append_1", "append_16", "checkpoint", "verify"}
    assert report["append_16"]["appenders"] == 16
    assert report["verify"]["records"] == 2_500
    for section in report.values():
        assert all(value >= 0 for value in section.values())
