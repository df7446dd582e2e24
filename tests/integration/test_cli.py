"""`owngate --help`, each subcommand's help, and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.main import main

COMMANDS = [
    [],
    ["serve"],
    ["demo"],
    ["sim"],
    ["config"],
    ["config", "validate"],
    ["keys"],
    ["keys", "new"],
    ["bench"],
    ["bench", "overhead"],
    ["policy"],
    ["policy", "check"],
    ["policy", "explain"],
    ["policy", "test"],
    ["audit"],
    ["audit", "verify"],
    ["audit", "prove"],
    ["audit", "receipt", "verify"],
    ["audit", "open"],
    ["audit", "show"],
    ["witness"],
    ["witness", "serve"],
    ["witness", "vkey"],
]


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: " ".join(w) or "owngate")
def test_help_exits_zero(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*words, "--help"])
    assert done.value.code == 0
    assert "usage: owngate" in capsys.readouterr().out


def test_no_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2


def test_serve_refuses_an_invalid_config(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text("backends: []\nlisten: {port: 1}\nbogus: 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "line 3: bogus: unknown key" in done.stderr
    assert "backends: " in done.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "owngate"
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("owngate ")
