"""Every module of the gateway stays under 400 lines (../shared/STYLE.md), as its provenance
package (tests/integration/test_provenance_content.py::test_modules_stay_small) and the
benchmarks (test_bench_modules_stay_small.py) do: a module past it is split along a seam,
a cohesive group moved to a module named for what it holds."""

from __future__ import annotations

from pathlib import Path

import gateway
from tests.helpers.module_size import long_modules


def test_gateway_modules_stay_small() -> None:
    assert long_modules(Path(gateway.__file__).parent) == []
