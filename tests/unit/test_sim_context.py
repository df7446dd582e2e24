"""`owngate sim --n-ctx`: the context length a simulator enforces, from the command line."""

from __future__ import annotations

import argparse

import pytest

from gateway.cli import sim as sim_cli
from gateway.sim import SimSettings


def _settings(argv: list[str]) -> SimSettings:
    parser = argparse.ArgumentParser(prog="owngate")
    sim_cli.register(parser.add_subparsers())
    return sim_cli.build_settings(parser.parse_args(["sim", *argv]))


def test_n_ctx_flag_environment_and_kind_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings([]).n_ctx == 8192  # vLLM's default kept
    assert _settings(["--kind", "llamacpp"]).n_ctx == 4096
    assert _settings(["--n-ctx", "65536"]).n_ctx == 65536  # a 100 KB prompt fits
    monkeypatch.setenv("OWNGATE_SIM_N_CTX", "32768")
    assert _settings([]).n_ctx == 32768


def test_n_ctx_must_be_positive() -> None:
    with pytest.raises(ValueError, match="n_ctx must be >= 1"):
        _settings(["--n-ctx", "0"])
