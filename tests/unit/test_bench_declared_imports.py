"""Every third-party module the benchmarks import (bench/owngate_bench) comes from a
distribution that owngate-bench declares, directly or through owngate's own declared
dependencies: none is there only because the dev extra, or some other package's
dependency (httpx through LiteLLM's openai), happens to install it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata

from packaging.requirements import Requirement

from tests.helpers.paths import REPO_ROOT

FIRST_PARTY = {"owngate_bench", "gateway"}


def _declared(pyproject: str) -> set[str]:
    with (REPO_ROOT / pyproject).open("rb") as file:
        dependencies = tomllib.load(file)["project"]["dependencies"]
    return {re.sub(r"[-_.]+", "-", Requirement(d).name).lower() for d in dependencies}


def _imported() -> dict[str, str]:
    """Each top-level module the bench package imports, with one file that imports it."""
    found: dict[str, str] = {}
    for path in sorted((REPO_ROOT / "bench" / "owngate_bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path.name)
    return found


def test_the_bench_declares_what_it_imports() -> None:
    declared = _declared("bench/pyproject.toml") | _declared("pyproject.toml")
    assert "owngate" in declared  # the bench declares owngate, and so owngate's dependencies
    providers = metadata.packages_distributions()
    third_party = {
        module: where
        for module, where in _imported().items()
        if module not in sys.stdlib_module_names and module not in FIRST_PARTY
    }
    assert {"httpx", "orjson", "uvloop"} <= set(third_party)  # the scan does see imports
    undeclared = {
        module: (where, providers.get(module))
        for module, where in third_party.items()
        if not {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(module, [])} & declared
    }
    assert undeclared == {}
