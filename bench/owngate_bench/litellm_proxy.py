"""LiteLLM proxy as a comparison target: a pinned release in an isolated virtualenv.

The overhead benchmark compares owngate with LiteLLM's proxy in front of the same
simulator. LiteLLM is never imported here: `ensure_venv` creates `.bench/litellm-venv`
with `python -m venv` and pip-installs `litellm[proxy]==VERSION` on first use (about a
minute), and `LiteLLMProxy` writes its config and builds the command line. Settings follow
LiteLLM's production advice: `LITELLM_LOG=ERROR`, `LITELLM_MODE=PRODUCTION`, the bundled
model cost map (no fetch at start-up), a master key (it refuses to start without one) and
no database. Importing the proxy alone takes ~8 s, so readiness waits are long.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

__all__ = [
    "DEFAULT_VERSION",
    "LiteLLMProxy",
    "ensure_venv",
    "installed_version",
]

DEFAULT_VERSION = "1.108.7"
"""`pip install 'litellm[proxy]'` resolved to this; 1.110.2's proxy extra is uninstallable."""

_INSTALL_TIMEOUT_S = 1200.0
_VERSION_PROBE = "import importlib.metadata as m; print(m.version('litellm'))"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed_version(venv: Path) -> str | None:
    """The litellm version installed in `venv`, or None when there is none."""
    python = _venv_python(venv)
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", _VERSION_PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        return None
    return probe.stdout.strip() or None


def _run_step(command: list[str], what: str) -> None:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        # pip prints a line per ignored local index; the error is at the end.
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr[-3000:]}")


def ensure_venv(
    venv: Path, version: str = DEFAULT_VERSION, log: Callable[[str], None] = print
) -> Path:
    """Make sure `venv` holds `litellm[proxy]==version`; return the `litellm` executable."""
    have = installed_version(venv)
    if have != version:
        if not _venv_python(venv).exists():
            log(f"creating {venv} for the LiteLLM comparison")
            venv.parent.mkdir(parents=True, exist_ok=True)
            _run_step([sys.executable, "-m", "venv", str(venv)], "python -m venv")
        log(f"installing litellm[proxy]=={version} into {venv} (first run only, ~1 min)")
        _run_step(
            [
                str(_venv_python(venv)),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"litellm[proxy]=={version}",
            ],
            "pip install litellm",
        )
        have = installed_version(venv)
        if have != version:
            raise RuntimeError(f"{venv} has litellm {have}, expected {version}")
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
