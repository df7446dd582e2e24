"""The options every TLS context owngate builds carries, client or server side.

TLS 1.2 is the least version, and renegotiation is refused (`OP_NO_RENEGOTIATION`): TLS
1.3 has none, and in TLS 1.2 a peer that renegotiates can change the certificate a
connection presents after the gateway checked it (its pins and certificate facts are read
once, after the first handshake) and makes the other side do handshake work at will.
Python's contexts allow it unless told. Every context goes through `harden`:
`gateway/upstream/tls.py` (backends), `gateway/attest/listener.py` (the sidecar's
listener), the witness client and the log mirror (`client_context`).
"""

from __future__ import annotations

import ssl

__all__ = ["client_context", "harden"]


def harden(context: ssl.SSLContext) -> ssl.SSLContext:
    """`context`, set to TLS 1.2 or later and no renegotiation."""
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION
    return context


def client_context() -> ssl.SSLContext:
    """A client context trusting the system's roots, the server's name checked."""
    return harden(ssl.create_default_context())
