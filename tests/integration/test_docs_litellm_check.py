"""The command the docs give operators to see why LiteLLM failed to load stays offline.

docs/observability.md tells an operator to run a `python -c "..."` in the gateway's
environment when hosted providers are unavailable. A bare `import litellm` outside the
gateway fetches LiteLLM's model cost map from GitHub (the gateway forces the local map,
gateway/upstream/litellm_runtime.py); each such command is run here in a child process
whose environment sets no `LITELLM_*` variable (an operator's shell), with an audit hook
that refuses, and reports, any name lookup or connection.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.doc_commands import doc_files
from tests.helpers.paths import REPO_ROOT

_PYTHON_C = re.compile(r'python -c "([^"]+)"')
_NO_NETWORK = """
import os, sys
def _refuse_network(event, args):
    if event in ("socket.getaddrinfo", "socket.connect"):
        os.write(2, ("NETWORK %s %r\\n" % (event, args[:2])).encode())
        raise OSError("no network in this check")
sys.addaudithook(_refuse_network)
"""


def _litellm_commands() -> list[tuple[str, str]]:
    """(doc file, code) of every `python -c "..."` a doc shows that loads LiteLLM."""
    found = []
    for path in doc_files():
        for code in _PYTHON_C.findall(path.read_text()):
            if "litellm" in code:
                found.append((path.relative_to(REPO_ROOT).as_posix(), code))
    return found


def _run_offline(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_")}
    environ["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-c", _NO_NETWORK + code],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_hook_reports_a_lookup(tmp_path: Path) -> None:
    done = _run_offline(
        "import socket\ntry: socket.getaddrinfo('localhost', 80)\nexcept OSError: pass", tmp_path
    )
    assert "NETWORK socket.getaddrinfo" in done.stderr, done.stderr


def test_the_documented_litellm_check_loads_it_without_the_network(tmp_path: Path) -> None:
    commands = _litellm_commands()
    assert any(source == "docs/observability.md" for source, _ in commands), commands
    for source, code in commands:
        done = _run_offline(code, tmp_path)
        assert "NETWORK" not in done.stderr, f"{source}: `{code}` reached out:\n{done.stderr}"
        assert done.returncode == 0, f"{source}: `{code}` failed:\n{done.stderr[-2000:]}"
