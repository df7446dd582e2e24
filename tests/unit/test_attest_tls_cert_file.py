"""`owngate attest --tls-cert` and `--tls-key` are read as a backend's TLS files are: each a
regular file of at most `MAX_TLS_FILE`, loaded from the bytes read (gateway/tls_files.py,
used by gateway/attest/listener.py `listener_context`).

OpenSSL's `load_cert_chain` opened the paths itself: a FIFO there held the sidecar's start
waiting for a writer, and `/dev/zero` could be read without end. Now either is refused at
once, and the sidecar does not start, saying which file and why.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest

from gateway.attest import listener_context
from gateway.cli.main import main
from gateway.tls_files import MAX_TLS_FILE
from tests.helpers.fifo_guard import call_guarded
from tests.helpers.tls import Pki


def _argv(tmp_path: Path, cert: Path, key: Path) -> list[str]:
    argv = ["attest", "--listen", "127.0.0.1:0", "--backend", "http://127.0.0.1:9"]
    argv += ["--key", str(tmp_path / "absent.key"), "--log", str(tmp_path / "log")]
    return [*argv, "--tls-cert", str(cert), "--tls-key", str(key)]


@pytest.mark.parametrize("which", ["cert", "key"])
def test_a_tls_cert_or_key_that_is_a_fifo_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    """Before: `listener_context` blocked in OpenSSL's open of the FIFO (until the guard
    wrote to it)."""
    pki = Pki.create(tmp_path / "pki")
    cert, key = pki.write("sidecar", pki.server())
    fifo = tmp_path / f"{which}.pem"
    os.mkfifo(fifo)
    files = (fifo, key) if which == "cert" else (cert, fifo)

    raised = call_guarded(lambda: listener_context(*files), fifo)
    assert isinstance(raised, OSError), raised
    assert "not a regular file" in str(raised) and str(fifo) in str(raised)

    status: list[int] = []
    argv = _argv(tmp_path, *files)
    assert call_guarded(lambda: status.append(main(argv)), fifo) is None
    assert status == [1]
    err = capsys.readouterr().err
    assert "TLS files not usable" in err and "not a regular file" in err and str(fifo) in err


def test_a_tls_cert_or_key_that_is_a_device_or_too_large_is_refused(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    cert, key = pki.write("sidecar", pki.server())
    zero = Path("/dev/zero")
    for files in ((zero, key), (cert, zero)):
        with pytest.raises(OSError, match="not a regular file"):
            listener_context(*files)
    huge = tmp_path / "huge.pem"
    huge.write_bytes(cert.read_bytes() + b"#" * MAX_TLS_FILE)
    with pytest.raises(OSError, match=f"larger than {MAX_TLS_FILE} bytes"):
        listener_context(huge, key)


def test_a_tls_cert_and_key_load_from_the_bytes_read(tmp_path: Path) -> None:
    """The pair still loads (through a memory file); a key that does not match its
    certificate is still refused by OpenSSL."""
    pki = Pki.create(tmp_path / "pki")
    cert, key = pki.write("sidecar", pki.server())
    _other, other_key = pki.write("other", pki.server())
    assert listener_context(cert, key).get_ca_certs() == []
    with pytest.raises(ssl.SSLError, match="KEY_VALUES_MISMATCH"):
        listener_context(cert, other_key)
