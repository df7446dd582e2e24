"""`owngate --help`, each subcommand's help, and exit codes."""

from __future__ import annotations

import importlib.abc
import subprocess
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

import pytest

from gateway.cli.main import main

COMMANDS = [
    [],
    ["serve"],
    ["demo"],
    ["sim"],
    ["attest"],
    ["status"],
    ["config"],
    ["config", "validate"],
    ["keys"],
    ["keys", "new"],
    ["keys", "revoke"],
    ["bench"],
    ["bench", "overhead"],
    ["bench", "routing"],
    ["bench", "scale"],
    ["bench", "seed-load"],
    ["bench", "provenance"],
    ["bench", "provenance-log"],
    ["bench", "policy"],
    ["bench", "state"],
    ["bench", "workloads"],
    ["bench", "receipts"],
    ["bench", "attest"],
    ["bench", "instructions"],
    ["policy"],
    ["policy", "check"],
    ["policy", "explain"],
    ["policy", "test"],
    ["audit"],
    ["audit", "verify"],
    ["audit", "prove"],
    ["audit", "proof", "verify"],
    ["audit", "receipt", "verify"],
    ["audit", "open"],
    ["audit", "show"],
    ["audit", "report"],
    ["witness"],
    ["witness", "init"],
    ["witness", "serve"],
    ["witness", "vkey"],
    ["backend"],
    ["backend", "cert", "ca"],
    ["backend", "cert", "issue"],
]


def _marked(words: list[str]) -> object:
    """A bench verb's help needs the owngate-bench distribution: the `bench` marker."""
    bench = words[:1] == ["bench"] and len(words) > 1
    return pytest.param(words, marks=pytest.mark.bench) if bench else words


@pytest.mark.parametrize(
    "words", [_marked(words) for words in COMMANDS], ids=lambda w: " ".join(w) or "owngate"
)
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


@pytest.mark.parametrize("words", [["bench"], ["bench", "overhead", "--quick"]])
def test_bench_without_its_distribution_says_how_to_install_it(
    words: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The runtime wheel has no benchmarks: without owngate-bench, `owngate bench` fails
    # with the install command instead of a traceback or a usage error.
    for name in [m for m in sys.modules if m.split(".")[0] == "owngate_bench"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NotInstalled(), *sys.meta_path])
    assert main(words) == 1
    assert "pip install -e ./bench" in capsys.readouterr().err


@pytest.mark.bench
def test_bench_verbs_run_without_the_owngate_front_end() -> None:
    argv = [sys.executable, "-m", "owngate_bench", "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    verbs = [words for words in COMMANDS if words[:1] == ["bench"] and len(words) == 2]
    assert {verb for _, verb in verbs} <= set(done.stdout.split())


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Imports of `owngate_bench` fail as they do where the distribution is not installed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.split(".")[0] == "owngate_bench":
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None
