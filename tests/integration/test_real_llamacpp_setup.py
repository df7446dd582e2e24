"""``server.probe``: the check ``setup.sh`` uses to pick a llama-server that serves here.

A binary that dies on this CPU (the prebuilt's SIGILL on CPUs without AVX-512/AMX) must
get a cached "does not serve" verdict, a server that hangs must get no verdict at all (a
loaded machine must not condemn the prebuilt for good), and the installed binary must
pass.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.prerequisites import real_backend
from tests.helpers.real_backend.server import SETUP_SCRIPT, ServerDidNotStart, probe


def fake_server(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_a_binary_killed_by_sigill_does_not_serve(tmp_path: Path) -> None:
    binary = fake_server(tmp_path, 'echo "AMX is not ready to be used!"; kill -ILL $$')
    problem = probe(binary, tmp_path / "model.gguf", log_dir=tmp_path / "logs", timeout_s=10.0)
    assert problem is not None
    assert f"exited with {-signal.SIGILL}" in problem
    assert "AMX is not ready" in problem  # the log's tail explains it


def test_a_server_that_never_answers_gets_no_verdict(tmp_path: Path) -> None:
    binary = fake_server(tmp_path, "exec sleep 30")
    with pytest.raises(ServerDidNotStart) as raised:
        probe(binary, tmp_path / "model.gguf", log_dir=tmp_path / "logs", timeout_s=0.5)
    assert raised.value.exit_code is None


def test_probe_command_line_exit_codes(tmp_path: Path) -> None:
    """``setup.sh`` caches 1 as a verdict and retries 3."""
    server_py = SETUP_SCRIPT.with_name("server.py")
    for body, timeout, expected in (("kill -ILL $$", "10", 1), ("exec sleep 30", "0.5", 3)):
        binary, model = fake_server(tmp_path, body), tmp_path / "model.gguf"
        argv = [sys.executable, str(server_py), "probe", str(binary), str(model)]
        done = subprocess.run(
            [*argv, "--log-dir", str(tmp_path), "--timeout", timeout],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == expected, done.stderr


@pytest.mark.real_backend
def test_the_installed_server_passes_the_probe(tmp_path: Path) -> None:
    installation = real_backend()
    assert probe(installation.server_binary, installation.tiny_model, log_dir=tmp_path) is None
