"""`owngate witness` prints what it read from key files escaped (`shown`): a key name is
any text without space or '+', so a log's or the witness's own name can hold ESC, a bidi
override or a bell, and must not drive the terminal that starts the witness."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import uvicorn

from gateway.cli import witness as witness_cli
from gateway.provenance import write_signing_key
from gateway.provenance.testing import seeded_signer
from tests.helpers.log_capture import kept_logging

LOG_NAME = "log\x1b]0;owned\x07.example/\u202eforged"
WITNESS_NAME = "witness\x1b[2J.example/w1"


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="owngate")
    witness_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def _controls(text: str) -> list[str]:
    return [char for line in text.split("\n") for char in line if not char.isprintable()]


def test_serve_prints_the_origins_and_its_key_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "witness.key"
    write_signing_key(key, WITNESS_NAME)
    monkeypatch.setattr(uvicorn.Server, "run", lambda _server: None)  # no socket: the banner
    log = seeded_signer(LOG_NAME).verifier().vkey
    state = str(tmp_path / "state.json")
    assert _run(["witness", "init", "--state", state]) == 0
    with kept_logging():  # serve configures logging onto capsys's stderr, closed after
        assert _run(["witness", "serve", "--key", str(key), "--log", log, "--state", state]) == 0
    err = capsys.readouterr().err
    assert _controls(err) == []
    assert "cosigning for: log\\x1b]0;owned\\x07.example/\\u202eforged\n" in err
    assert "witness witness\\x1b[2J.example/w1+" in err


def test_vkey_prints_the_key_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "witness.key"
    write_signing_key(key, WITNESS_NAME)
    assert _run(["witness", "vkey", "--key", str(key)]) == 0
    out = capsys.readouterr().out
    assert _controls(out) == []
    assert out.startswith("witness\\x1b[2J.example/w1+")
