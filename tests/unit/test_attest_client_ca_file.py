"""`owngate attest --client-ca` is read as a backend's `tls.ca_file` is: a regular file,
bounded, loaded from the bytes read (gateway/attest/listener.py `listener_context`).

OpenSSL opened the path itself, then `read_bytes()` read it again: a FIFO there held the
sidecar's start waiting for a writer (and `/dev/zero` was read without end). Now either is
refused at once, and the sidecar does not start, saying which file and why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.attest import listener_context
from gateway.cli.main import main
from gateway.tls_files import MAX_TLS_FILE
from tests.helpers.fifo_guard import call_guarded
from tests.helpers.tls import Pki


def _argv(tmp_path: Path, cert: Path, key: Path, client_ca: Path) -> list[str]:
    argv = ["attest", "--listen", "127.0.0.1:0", "--backend", "http://127.0.0.1:9"]
    argv += ["--key", str(tmp_path / "absent.key"), "--log", str(tmp_path / "log")]
    return [*argv, "--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(client_ca)]


def test_a_client_ca_that_is_not_a_regular_file_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `listener_context` blocked opening the FIFO (until the guard wrote to it)."""
    pki = Pki.create(tmp_path / "pki")
    cert, key = pki.write("sidecar", pki.server())
    fifo = tmp_path / "client-ca.pem"
    os.mkfifo(fifo)

    raised = call_guarded(lambda: listener_context(cert, key, fifo), fifo)
    assert isinstance(raised, OSError), raised
    assert "not a regular file" in str(raised) and str(fifo) in str(raised)

    status: list[int] = []
    assert call_guarded(lambda: status.append(main(_argv(tmp_path, cert, key, fifo))), fifo) is None
    assert status == [1]
    err = capsys.readouterr().err
    assert "TLS files not usable" in err and "not a regular file" in err and str(fifo) in err

    with pytest.raises(OSError, match="not a regular file"):
        listener_context(cert, key, Path("/dev/zero"))  # before: read without end


def test_a_client_ca_too_large_or_without_a_certificate_is_refused(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    cert, key = pki.write("sidecar", pki.server())
    huge = tmp_path / "huge.pem"
    huge.write_bytes(pki.ca.cert_pem + b"#" * MAX_TLS_FILE)
    with pytest.raises(OSError, match=f"larger than {MAX_TLS_FILE} bytes"):
        listener_context(cert, key, huge)
    for name, content in (("empty.pem", b""), ("junk.pem", b"junk\n")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(OSError, match="holds no PEM certificate") as refused:
            listener_context(cert, key, tmp_path / name)
        assert str(tmp_path / name) in str(refused.value)


def test_a_client_ca_with_explanatory_text_loads_as_before(tmp_path: Path) -> None:
    """A bundle's text around its PEM blocks (UTF-8 in some) is what OpenSSL's file loader
    skipped: such a file loads, and requires client certificates."""
    pki = Pki.create(tmp_path / "pki")
    cert, key = pki.write("sidecar", pki.server())
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes("# Issuer: CN=Gateways CA, O=Förderung\n".encode() + pki.ca.cert_pem)
    context = listener_context(cert, key, bundle)
    assert context.verify_mode.name == "CERT_REQUIRED"
    assert len(context.get_ca_certs()) == 1
