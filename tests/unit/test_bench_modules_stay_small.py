"""The benchmarks' modules stay under 400 lines, as the gateway's provenance package does
(tests/integration/test_provenance_content.py::test_modules_stay_small): a module past
it is split by what it does (bench/owngate_bench/attest.py: running the targets, and
reading and printing their figures, attest_report.py)."""

from __future__ import annotations

from tests.helpers.module_size import long_modules
from tests.helpers.paths import REPO_ROOT


def test_bench_modules_stay_small() -> None:
    assert long_modules(REPO_ROOT / "bench" / "owngate_bench") == []
