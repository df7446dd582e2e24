"""TLS on the sidecar's own listener (`owngate attest --tls-cert --tls-key [--client-ca]`).

With a client CA the sidecar is the backend's mutual-TLS endpoint: only a client whose
certificate chains to that CA (the gateway's) completes a handshake, so nothing that
bypasses the gateway gets an answer countersigned in its name, and the gateway pins the
sidecar's key (`tls.pin_spki_sha256`, docs/backend-tls.md). TLS 1.2 is the minimum and
renegotiation is refused, as on the gateway's side (`gateway/tls_options.py`); HTTP/1.1
is offered by ALPN.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from gateway.tls_options import harden

__all__ = ["listener_context"]


def listener_context(
    cert_file: Path, key_file: Path, client_ca: Path | None = None
) -> ssl.SSLContext:
    """A server context presenting `cert_file` (PEM, may hold the chain) with its
    unencrypted `key_file`; with `client_ca`, a client certificate chaining to it is
    required. OSError or ssl.SSLError when a file is missing or does not fit."""
    context = harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    context.set_alpn_protocols(["http/1.1"])
    # An encrypted key fails here (the empty passphrase does not open it), never prompts.
    context.load_cert_chain(cert_file, key_file, password=b"")
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
