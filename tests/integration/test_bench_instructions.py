"""`owngate bench instructions`: callgrind's counts of plain owngate and the production
configuration. The run is checked for shape and for what must hold whatever the machine
(the production configuration does strictly more work per request than plain owngate: a
policy set, a signed record and a receipt); the counts themselves are not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from owngate_bench.instructions import count_calls, count_total
from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.bench

_ANNOTATED = """\
--------------------------------------------------------------------------------
Profile data file 'callgrind.out.1' (creator: callgrind-3.19.0)
Events recorded:  Ir
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
608,590,596 (100.0%)  PROGRAM TOTALS
--------------------------------------------------------------------------------
"""


def test_count_total_reads_the_program_totals() -> None:
    assert count_total(_ANNOTATED) == 608_590_596


def test_count_calls_sums_the_calls_of_a_function_by_its_compressed_name() -> None:
    dump = (
        "fn=(1) uv__stream_io\ncfn=(2) uv__read\ncalls=3 10\n5 400\n"
        "cfn=(3) uv__write\ncalls=4 20\n6 300\n"
        "fn=(4) other\ncfn=(2)\ncalls=2 10\n5 200\n"
    )
    assert count_calls(dump, "uv__read") == 5
    assert count_calls(dump, "uv__write") == 4
    assert count_calls(dump, "missing") == 0


def test_count_total_refuses_output_without_totals() -> None:
    with pytest.raises(ValueError, match="PROGRAM TOTALS"):
        count_total("Ir\n 12 (50.0%) somewhere\n")


def test_unknown_target_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "instructions", "--targets", "nginx"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--targets" in proc.stderr


def test_a_short_run_counts_both_configurations(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    argv = ["bench", "instructions", "--requests", "30", "--json", "--keep-dumps", str(dumps)]
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,  # two gateways under valgrind: ~30 s each alone, >900 s at load 7; a hang
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["requests"] == 30 and report["concurrency"] == 1
    plain, production = report["targets"]["owngate"], report["targets"]["owngate+production"]
    assert plain["per_request"] == plain["instructions"] / 30 > 0
    assert production["per_request"] > plain["per_request"]
    # --keep-dumps: each target's dump of the measured requests, the total it reported
    for target, name in (("owngate", "owngate"), ("owngate+production", "owngate-production")):
        kept = dumps / f"callgrind-{name}.out"
        annotated = subprocess.run(
            ["callgrind_annotate", str(kept)], capture_output=True, text=True, check=True
        ).stdout
        assert count_total(annotated) == report["targets"][target]["instructions"]
