"""`owngate attest`'s start-up checks run in this process: `MISSING_TLS` (TLS files that
do not exist, so a command past the checks stops there, exit 1, before it binds a port or
opens its key) and `checks_only` (no port is ever bound, the named `OWNGATE_ATTEST_*`
variables unset, the working directory a temporary one)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

import gateway.serving

__all__ = ["MISSING_TLS", "checks_only"]

MISSING_TLS = ["--tls-cert", "missing.pem", "--tls-key", "missing-key.pem"]


def _never_bound(host: str, port: int) -> None:
    raise OSError("no port is bound in this test")


def checks_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, unset: Iterable[str]) -> None:
    """A command past every check would bind its address: it stops there instead, exit 1
    ("cannot listen"), which no refusal is."""
    monkeypatch.setattr(gateway.serving, "bind_socket", _never_bound)
    for name in unset:
        monkeypatch.delenv(f"OWNGATE_ATTEST_{name}", raising=False)
    monkeypatch.chdir(tmp_path)
