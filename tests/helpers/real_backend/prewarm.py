"""Start the real llama-server's installation in the background as soon as a session
knows it will need it (a `real_backend` test is selected), so that a cold source build
(10-15 minutes on two cores, tests/helpers/real_backend/setup.sh) overlaps the tests
that come before the first one using it, instead of stopping the run at that test.

The build runs at the lowest priority (`nice -n 19`): the tests keep the CPU they would
have had, the build takes what they leave. The first test that reaches for the server
runs setup.sh itself, as before (tests/helpers/prerequisites.py); setup.sh takes one
installer at a time per directory (flock), so that call waits for this one and then
finds everything in place, or reports the failure itself when this one failed. What
this one printed is kept in `prewarm.log` in the installation directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import suppress

from tests.helpers.real_backend.server import SETUP_SCRIPT, default_install_dir

__all__ = ["start", "stop"]


def start() -> subprocess.Popen[bytes] | None:
    """Run setup.sh (with SmolLM2) in its own session at the lowest priority; None where
    this process is not the one to do it (a pytest-xdist worker other than the first)."""
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return None
    root = default_install_dir().resolve()
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    with open(root / "prewarm.log", "wb") as log:
        return subprocess.Popen(
            ["nice", "-n", "19", "bash", str(SETUP_SCRIPT), str(root), "--with-smollm2"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """At the session's end: stop an installation still running (and the compiler it
    started: its whole session), so the run leaves no process behind."""
    if proc is None or proc.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
