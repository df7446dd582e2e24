"""docs/architecture.md names every module under gateway/ with its job, and names no module
that is gone: the "Every module" table, and every `gateway/...` path the page mentions."""

from __future__ import annotations

import re

from tests.helpers.paths import REPO_ROOT

ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `(gateway/[^`]+\.py)` \| (.*) \|$", re.MULTILINE)


def modules() -> set[str]:
    return {
        path.relative_to(REPO_ROOT).as_posix()
        for path in (REPO_ROOT / "gateway").rglob("*.py")
        if "__pycache__" not in path.parts
    }


def test_every_module_has_a_row_with_a_job() -> None:
    rows = dict(ROW.findall(ARCHITECTURE.read_text()))
    missing = sorted(modules() - rows.keys())
    assert not missing, f"docs/architecture.md has no row for {missing}"
    jobless = sorted(name for name, job in rows.items() if len(job.strip()) < 10)
    assert not jobless, f"docs/architecture.md gives no job for {jobless}"


def test_no_module_the_page_names_is_gone() -> None:
    text = ARCHITECTURE.read_text()
    named = set(re.findall(r"gateway/[A-Za-z0-9_/]+\.py", text))
    gone = sorted(name for name in named if not (REPO_ROOT / name).is_file())
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"
    folders = set(re.findall(r"`(gateway/[A-Za-z0-9_/]+/)`", text))
    gone_folders = sorted(name for name in folders if not (REPO_ROOT / name).is_dir())
    assert not gone_folders, f"docs/architecture.md names missing packages: {gone_folders}"


def test_a_package_row_names_only_files_of_that_package() -> None:
    """In "The parts", a row for a package (`gateway/api/`) names its files by their short
    name (`stream_relay.py`): each must be a file somewhere under that package."""
    text = ARCHITECTURE.read_text()
    parts = text.split("## The parts", 1)[1].split("\n## ", 1)[0]
    gone = []
    for package, cells in re.findall(r"^\| `(gateway/[a-z_/]+/)` \|(.*)$", parts, re.MULTILINE):
        root = REPO_ROOT / package
        for short in re.findall(r"`([a-z_/]+\.py)`", cells):
            if short.startswith("gateway/"):
                continue
            if not (root / short).is_file() and not list(root.rglob(short.split("/")[-1])):
                gone.append(f"{package}{short}")
    assert not gone, f"docs/architecture.md names files that are not in their package: {gone}"
