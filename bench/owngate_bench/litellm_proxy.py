"""LiteLLM proxy as a comparison target: a vetted release in an isolated virtualenv.

The overhead benchmark compares owngate with LiteLLM's proxy in front of the same
simulator. LiteLLM is never imported here: `ensure_venv` creates `.bench/litellm-venv`
with `python -m venv` and installs `litellm-proxy.lock` (beside this module: every
distribution pinned, with its sha256 hashes) by `pip install --require-hashes --no-deps
--only-binary :all:`, on first use (about a minute); a venv whose distributions differ
from the lock is rebuilt when the bench made it, refused otherwise. `LiteLLMProxy` writes
its config and builds the command line. Settings follow LiteLLM's production advice:
`LITELLM_LOG=ERROR`, `LITELLM_MODE=PRODUCTION`, the bundled model cost map (no fetch at
start-up), a master key (it refuses to start without one) and no database. Importing the
proxy alone takes ~8 s, so readiness waits are long.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

__all__ = [
    "DEFAULT_VERSION",
    "LOCK",
    "LiteLLMProxy",
    "LockedPin",
    "ensure_venv",
    "install_command",
    "installed_version",
    "lock_mismatches",
    "read_lock",
]

DEFAULT_VERSION = "1.108.7"
"""The vetted release (requirements/constraints.txt) that `LOCK` pins; 1.110.2's proxy
extra is uninstallable, 1.82.7 and 1.82.8 were compromised."""

LOCK = Path(__file__).with_name("litellm-proxy.lock")
"""The venv's every distribution with its hashes; `make lock` re-resolves it."""

_MARK = "owngate-bench-lock"
"""In a venv the bench made: the lock's sha256 once installed and checked, else empty."""

_INSTALL_TIMEOUT_S = 1200.0
_VERSION_PROBE = "import importlib.metadata as m; print(m.version('litellm'))"
_DISTRIBUTIONS_PROBE = (
    "import importlib.metadata as m, json; "
    "print(json.dumps([[d.metadata['Name'], d.version] for d in m.distributions()]))"
)
_PIN = re.compile(
    r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?"
)


@dataclasses.dataclass(frozen=True)
class LockedPin:
    """One `name==version` line of a lock; `marker` is its environment marker, if any."""

    name: str
    version: str
    marker: str | None


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> list[LockedPin]:
    """The pins of a `uv pip compile --generate-hashes` lock (its hash and comment lines
    are not pins); a line at the margin that is not a pin raises ValueError."""
    pins = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line[0] in "# ":
            continue
        match = _PIN.fullmatch(line)
        if match is None:
            raise ValueError(f"{path.name}: not a pinned requirement: {line[:80]!r}")
        name, version, marker = match.groups()
        pins.append(LockedPin(_canonical(name), version, marker))
    return pins


def install_command(python: Path, lock: Path = LOCK) -> list[str]:
    """pip installing exactly `lock` with `python`: every file checked against the lock's
    hashes, no dependency resolved beyond it, no source built (a build's own
    requirements would be fetched unhashed)."""
    return [
        str(python),
        "-I",  # isolated: no PYTHONPATH (the bench's own) nor user site on its path
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "--require-hashes",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-r",
        str(lock),
    ]


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _probe(venv: Path, script: str) -> str | None:
    python = _venv_python(venv)
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-I", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        return None
    return probe.stdout.strip() or None


def installed_version(venv: Path) -> str | None:
    """The litellm version installed in `venv`, or None when there is none."""
    return _probe(venv, _VERSION_PROBE)


def lock_mismatches(venv: Path, pins: list[LockedPin]) -> list[str]:
    """How `venv`'s distributions differ from `pins`: one installed that no pin names at
    that version, or one pinned for every platform (no marker) that is not installed."""
    listed = _probe(venv, _DISTRIBUTIONS_PROBE)
    if listed is None:
        return [f"cannot list the distributions in {venv}"]
    installed = {(_canonical(name), version) for name, version in json.loads(listed)}
    locked = {(pin.name, pin.version) for pin in pins}
    unlocked = [f"{name} {version} is not in the lock" for name, version in installed - locked]
    unconditional = {(pin.name, pin.version) for pin in pins if pin.marker is None}
    missing = [f"{name}=={version} is not installed" for name, version in unconditional - installed]
    return sorted(unlocked) + sorted(missing)


def _run_step(command: list[str], what: str) -> None:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        # pip prints a line per ignored local index; the error is at the end.
        output = (done.stderr or done.stdout)[-3000:]
        raise RuntimeError(f"{what} failed ({done.returncode}): {output}")


def _checked(venv: Path, version: str, pins: list[LockedPin]) -> list[str]:
    have = installed_version(venv)
    problems = [] if have == version else [f"litellm is {have}, not {version}"]
    return problems + lock_mismatches(venv, pins)


def ensure_venv(
    venv: Path,
    version: str = DEFAULT_VERSION,
    log: Callable[[str], None] = print,
    lock: Path = LOCK,
) -> Path:
    """Make sure `venv` holds exactly `lock`, which pins `litellm==version`; return the
    `litellm` executable. A venv the bench made that differs from the lock is rebuilt;
    any other directory that differs is left alone and refused (RuntimeError)."""
    pins = read_lock(lock)
    locked = [pin.version for pin in pins if pin.name == "litellm"]
    if locked != [version]:
        raise RuntimeError(
            f"{lock.name} pins litellm {', '.join(locked) or 'nowhere'}, not {version}: "
            "only a locked release is installed (vet another, then `make lock`)"
        )
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    mark = venv / _MARK
    if venv.exists() and any(venv.iterdir()):
        if not mark.exists():
            raise RuntimeError(
                f"{venv} is not a virtualenv the bench installed from {lock.name}: remove "
                "it (an older bench's venv, installed without hashes) or name another "
                "--litellm-venv"
            )
        if mark.read_text(encoding="utf-8") != digest:
            problems = ["not installed and checked from this lock"]
        else:
            problems = _checked(venv, version, pins)
            if not problems:
                return venv / "bin" / "litellm"
        log(f"{venv} does not match {lock.name} ({problems[0]}): rebuilding it")
        shutil.rmtree(venv)
    log(f"creating {venv} for the LiteLLM comparison")
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run_step([sys.executable, "-m", "venv", str(venv)], "python -m venv")
    mark.write_text("", encoding="utf-8")  # made here: a failed install is rebuilt next time
    log(f"installing {lock.name} (litellm[proxy]=={version}) into {venv} (~2 min)")
    python = _venv_python(venv)
    _run_step(install_command(python, lock), "pip install --require-hashes")
    _run_step([str(python), "-I", "-m", "pip", "check"], "pip check")
    problems = _checked(venv, version, pins)
    if problems:
        raise RuntimeError(f"{venv} does not match {lock.name}: {'; '.join(problems[:5])}")
    mark.write_text(digest, encoding="utf-8")
    return venv / "bin" / "litellm"


@dataclasses.dataclass(frozen=True)
class LiteLLMProxy:
    """One LiteLLM proxy in front of an OpenAI-compatible backend (the simulator)."""

    executable: Path
    workdir: Path
    backend_url: str  # server root; LiteLLM's openai provider wants `/v1` appended
    model: str
    master_key: str
    host: str
    port: int
    workers: int = 1

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    ready_path: ClassVar[str] = "/health/liveliness"

    def write_config(self) -> Path:
        """Write the proxy's YAML (as JSON, which YAML accepts) and return its path."""
        config = {
            "model_list": [
                {
                    "model_name": self.model,
                    "litellm_params": {
                        "model": f"openai/{self.model}",
                        "api_base": f"{self.backend_url}/v1",
                        "api_key": "sk-bench-dummy",
                    },
                }
            ],
            "general_settings": {"master_key": self.master_key},
            "litellm_settings": {"set_verbose": False},
        }
        path = self.workdir / "litellm.yaml"
        path.write_text(json.dumps(config, indent=2))
        return path

    def command(self) -> list[str]:
        return [
            str(self.executable),
            "--config",
            str(self.write_config()),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--num_workers",
            str(self.workers),
        ]

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        env = {
            key: value
            for key, value in base.items()
            if key not in {"DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV"}
            and not key.startswith("LITELLM_")
        }
        env.update(
            {
                "LITELLM_LOG": "ERROR",
                "LITELLM_MODE": "PRODUCTION",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "NO_DOCS": "True",
            }
        )
        env["PATH"] = f"{self.executable.parent}{os.pathsep}{base.get('PATH', '')}"
        return env
