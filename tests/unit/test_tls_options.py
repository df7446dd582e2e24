"""Every TLS context owngate builds refuses renegotiation and anything before TLS 1.2
(gateway/tls_options.py): the backends' (system roots, own CA, mutual TLS), the sidecar's
listener (with and without a client CA), the log mirror's and the witness client's."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.attest import listener_context
from gateway.pki import issue, make_ca
from gateway.provenance.audit import remote
from gateway.provenance.audit.remote_socket import Watch
from gateway.tls_options import client_context, os_roots_context
from gateway.upstream.tls import backend_tls, system_tls
from tests.helpers.gateways import backend, gateway_config

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _hardened(context: ssl.SSLContext) -> bool:
    return (
        bool(context.options & ssl.OP_NO_RENEGOTIATION)
        and context.minimum_version >= ssl.TLSVersion.TLSv1_2
    )


def _backend_contexts(tmp_path: Path) -> dict[str, ssl.SSLContext]:
    ca = make_ca("ca", now=NOW)
    client = issue(ca, "gateway", now=NOW, client=True)
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    (tmp_path / "c.pem").write_bytes(client.cert_pem)
    (tmp_path / "k.pem").write_bytes(client.key_pem)
    mutual = {"ca_file": "ca.pem", "client_cert_file": "c.pem", "client_key_file": "k.pem"}
    shapes = {"system-roots": None, "own-ca": {"ca_file": "ca.pem"}, "mutual": mutual}
    contexts = {"plain-https": system_tls("gpu.internal").context}
    for name, tls in shapes.items():
        extra: dict[str, Any] = {} if tls is None else {"tls": tls}
        config = gateway_config([backend("gpu", "https://gpu.internal:8443", "m", **extra)])
        contexts[name] = backend_tls(config.backends[0], "gpu.internal", tmp_path).context
    return contexts


def _listener_contexts(tmp_path: Path) -> dict[str, ssl.SSLContext]:
    ca = make_ca("ca", now=NOW)
    server = issue(ca, "127.0.0.1", now=NOW)
    (tmp_path / "s.pem").write_bytes(server.cert_pem)
    (tmp_path / "s-key.pem").write_bytes(server.key_pem)
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    cert, key = tmp_path / "s.pem", tmp_path / "s-key.pem"
    return {
        "sidecar": listener_context(cert, key),
        "sidecar-mtls": listener_context(cert, key, tmp_path / "ca.pem"),
    }


def test_every_backend_context_refuses_renegotiation(tmp_path: Path) -> None:
    contexts = _backend_contexts(tmp_path)
    assert {name: _hardened(c) for name, c in contexts.items()} == dict.fromkeys(contexts, True)


def test_the_sidecars_listener_refuses_renegotiation(tmp_path: Path) -> None:
    contexts = _listener_contexts(tmp_path)
    assert {name: _hardened(c) for name, c in contexts.items()} == dict.fromkeys(contexts, True)


def test_the_log_mirror_and_witness_client_refuse_renegotiation() -> None:
    assert _hardened(client_context())
    assert _hardened(os_roots_context())  # the witness client's
    handler = remote._SecureHandler(Watch())  # the mirror's https handler
    assert _hardened(handler.tls)


def test_pythons_own_default_allows_renegotiation() -> None:
    """Why `harden` exists: the tests above could not pass with Python's defaults."""
    assert not ssl.create_default_context().options & ssl.OP_NO_RENEGOTIATION


def test_os_roots_that_cannot_be_loaded_are_no_roots(tmp_path: Path, monkeypatch: Any) -> None:
    """OpenSSL's default CA file present but empty (or unreadable): `load_default_certs`,
    which the system contexts used, skips it; `os_roots_context` raised `SSLError`, so
    building any private https backend's TLS without `tls.ca_file` (`system_tls`,
    `backend_tls`) and every witness connection failed. Now such a system's contexts
    trust no root, as before."""
    empty = tmp_path / "cert.pem"
    empty.write_bytes(b"")
    paths = ssl.get_default_verify_paths()._replace(
        openssl_cafile=str(empty), openssl_capath=str(tmp_path / "none")
    )
    monkeypatch.setattr(ssl, "get_default_verify_paths", lambda: paths)
    context = os_roots_context()
    assert _hardened(context)
    assert context.get_ca_certs() == []
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
