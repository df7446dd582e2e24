"""`owngate attest` relays to a server on its own host's loopback, or says on purpose that
it relays elsewhere (`--allow-remote-backend`).

The sidecar's countersignature is the backend host's word that it served an answer, and
the hop from the sidecar to the server is plain HTTP that nothing authenticates. With a
`--backend` on another machine (a typo in an address, or a name) a DNS or network
attacker on that hop reads every prompt and answers what it likes, and the sidecar signs
it as its host's: the two-party statement covers a server in another room, or another
country. It used to relay to any URL without a word. Refused here before a key, a TLS
file or a port is touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import main
from tests.helpers.attest_cli import MISSING_TLS, checks_only

_REST = ["--key", "k", "--log", "l", "--listen", "127.0.0.1:8101"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    checks_only(
        monkeypatch,
        tmp_path,
        ("LISTEN", "BACKEND", "TLS_CERT", "TLS_KEY", "CLIENT_CA", "ALLOW_REMOTE_BACKEND"),
    )


@pytest.mark.parametrize(
    "backend",
    [
        "http://10.0.3.8:8000",
        "http://vllm.internal:8000",
        "https://gpu-fra-2.example.com",
        "http://127.0.0.1.nip.io:8000",
        "http://[2001:db8::7]:8000",
        "127.0.0.1:8000",  # no scheme: no host either
    ],
)
def test_a_backend_off_the_sidecars_host_is_refused(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["attest", "--backend", backend, *_REST, *MISSING_TLS]) == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err and "--allow-remote-backend" in err
    assert "TLS files not usable" not in err  # refused before any file is read


@pytest.mark.parametrize(
    ("backend", "extra"),
    [
        ("http://127.0.0.1:8000", []),
        ("http://127.0.0.2:8000/", []),
        ("http://[::1]:8000", []),
        ("http://localhost:8000", []),
        ("http://LOCALHOST:8000", []),
        ("http://10.0.3.8:8000", ["--allow-remote-backend"]),
    ],
)
def test_loopback_or_the_explicit_flag_pass_the_check(
    backend: str, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["attest", "--backend", backend, *_REST, *MISSING_TLS, *extra]) == 1
    assert "TLS files not usable" in capsys.readouterr().err


def test_the_flag_has_its_environment_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["attest", "--backend", "http://10.0.3.8:8000", *_REST, *MISSING_TLS]
    monkeypatch.setenv("OWNGATE_ATTEST_ALLOW_REMOTE_BACKEND", "1")
    assert main(argv) == 1
    assert "TLS files not usable" in capsys.readouterr().err
    monkeypatch.setenv("OWNGATE_ATTEST_ALLOW_REMOTE_BACKEND", "0")
    assert main(argv) == 2
