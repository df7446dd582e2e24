"""The house limit on a module's length (../shared/STYLE.md: aim under 400 lines), checked by
the module-size tests of the gateway, its provenance package and the benchmarks."""

from __future__ import annotations

from pathlib import Path

MAX_LINES = 400  # a module this long or longer is split along a seam


def long_modules(package: Path) -> list[str]:
    """Every module below `package` of MAX_LINES lines or more, as `path: lines`."""
    modules = sorted(package.rglob("*.py"))
    assert modules, package  # the package is where the test looks
    lengths = {path: len(path.read_text().splitlines()) for path in modules}
    return [
        f"{path.relative_to(package)}: {lines}"
        for path, lines in lengths.items()
        if lines >= MAX_LINES
    ]
