"""`owngate attest` on an address others reach needs `--client-ca` (mutual TLS), or says
on purpose that it serves anyone (`--allow-any-client`).

Without client certificates, whoever reaches the sidecar's port gets its answers
countersigned and logged: each such statement is one `owngate audit verify --attest-log`
reports as traffic that bypassed the gateway (a failure the append-only log keeps for
good), and the server's probes (`/slots`, `/metrics`) answer them too. It used to start
so on any address without a word. Refused here before a key, a TLS file or a port is
touched; a loopback address (the default) is the host's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import main
from tests.helpers.attest_cli import MISSING_TLS, checks_only

_BASE = ["attest", "--backend", "http://127.0.0.1:8000", "--key", "k", "--log", "l"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    checks_only(
        monkeypatch,
        tmp_path,
        ("LISTEN", "TLS_CERT", "TLS_KEY", "CLIENT_CA", "CLIENT_PIN", "ALLOW_ANY_CLIENT"),
    )


@pytest.mark.parametrize(
    "listen", ["0.0.0.0:8101", "[::]:8101", "10.0.3.7:8101", "gpu-fra-1.internal:8101"]
)
@pytest.mark.parametrize("tls", [[], MISSING_TLS], ids=["plain", "tls"])
def test_a_sidecar_others_reach_without_client_certificates_is_refused(
    listen: str, tls: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_BASE, "--listen", listen, *tls]) == 2
    err = capsys.readouterr().err
    assert "--client-ca" in err and "--allow-any-client" in err
    assert "TLS files not usable" not in err  # refused before any file is read


@pytest.mark.parametrize(
    ("listen", "extra"),
    [
        ("127.0.0.1:8101", []),
        ("127.0.0.2:8101", []),
        ("[::1]:8101", []),
        ("localhost:8101", []),
        ("0.0.0.0:8101", ["--client-ca", "ca.pem"]),
        ("10.0.3.7:8101", ["--allow-any-client"]),
    ],
)
def test_loopback_mutual_tls_or_the_explicit_flag_pass_the_check(
    listen: str, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_BASE, "--listen", listen, *MISSING_TLS, *extra]) == 1
    assert "TLS files not usable" in capsys.readouterr().err


def test_the_flag_has_its_environment_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OWNGATE_ATTEST_ALLOW_ANY_CLIENT", "1")
    assert main([*_BASE, "--listen", "10.0.3.7:8101", *MISSING_TLS]) == 1
    assert "TLS files not usable" in capsys.readouterr().err
    monkeypatch.setenv("OWNGATE_ATTEST_ALLOW_ANY_CLIENT", "0")
    assert main([*_BASE, "--listen", "10.0.3.7:8101", *MISSING_TLS]) == 2
