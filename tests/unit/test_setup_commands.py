"""The README's two set-up commands on a fresh machine: `make demo` and `make test` first
install from the hash-locked dev lock (nothing resolved, nothing unhashed), `make test`
runs every check with no group deselected, and `.ci/run` runs exactly `make test`."""

from __future__ import annotations

import re

from tests.helpers.paths import REPO_ROOT


def _makefile_rules() -> dict[str, tuple[list[str], list[str]]]:
    """target -> (its prerequisites, its recipe lines), for the Makefile's explicit rules."""
    rules: dict[str, tuple[list[str], list[str]]] = {}
    current: list[str] | None = None
    for line in (REPO_ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line.strip())
            continue
        rule = re.fullmatch(r"([^\s:=#.][^\s:=#]*|\$\(STAMP\)):(?!=)\s*(.*)", line)
        current = None
        if rule is not None:
            current = []
            rules[rule.group(1)] = (rule.group(2).split(), current)
    return rules


def test_readme_commands_are_make_demo_and_make_test_and_ci_runs_the_second() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    code = [line.strip() for line in ci if line.strip() and not line.lstrip().startswith("#")]
    assert code[-1] == "exec make test"
    assert not [line for line in code if re.search(r"\b(pytest|make)\b", line)][:-1]


def test_both_commands_install_from_the_hashed_lock_first() -> None:
    rules = _makefile_rules()
    stamp_needs, install = rules["$(STAMP)"]
    assert "requirements/dev.lock" in stamp_needs
    pips = [line for line in install if " pip install " in line]
    assert pips and all("--no-deps" in line for line in pips), "the lock alone decides"
    assert "--require-hashes" in pips[0] and pips[0].endswith("-r requirements/dev.lock")
    assert all(" -r " not in line for line in pips[1:]), "one requirements file: the lock"
    for target in ("demo", "test"):
        assert rules[target][0] == ["$(STAMP)"], target
    assert rules["demo"][1] == ["$(BIN)/owngate demo"]
    assert rules["test"][1] == [
        "$(BIN)/ruff check .",
        "$(BIN)/ruff format --check .",
        "$(BIN)/mypy",
        # no -m: a missing prerequisite fails its group, not skips it; one process unless
        # TEST_WORKERS asks for pytest-xdist's (a module's tests together on one of them)
        "$(BIN)/pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)",
    ]
