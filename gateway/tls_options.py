"""The options every TLS context owngate builds carries, client or server side.

TLS 1.2 is the least version, a peer's name is read from its subject alternative names
alone, and renegotiation is refused (`OP_NO_RENEGOTIATION`). Names: OpenSSL falls back to
the subject's common name when a certificate has no DNS SAN, also one with URI SANs (a
backend's `owngate:` facts, a SPIFFE ID), which RFC 6125 (6.4.4) forbids; a certificate a
CA issued to a workload or a user whose CN is, or was chosen as, a backend's host passed
as that backend's. Renegotiation: TLS
1.3 has none, and in TLS 1.2 a peer that renegotiates can change the certificate a
connection presents after the gateway checked it (its pins and certificate facts are read
once, after the first handshake) and makes the other side do handshake work at will.
Python's contexts allow it unless told. Every context goes through `harden`:
`gateway/upstream/tls.py` (backends), `gateway/attest/listener.py` (the sidecar's
listener), the witness client and the log mirror (`client_context`).

The gateway's own outbound contexts (private backends without `tls.ca_file`, witnesses)
trust the operating system's roots as OpenSSL was built to find them (`os_roots_context`),
not the files `SSL_CERT_FILE` / `SSL_CERT_DIR` name: OpenSSL reads those variables when a
context loads its default roots, so a CA named only in the process environment could
answer for any such backend or witness. `client_context` (the auditor's log mirror, run
by the auditor) keeps them, as urllib and curl do.
"""

from __future__ import annotations

import os
import ssl

__all__ = ["client_context", "harden", "os_roots_context"]


def harden(context: ssl.SSLContext) -> ssl.SSLContext:
    """`context`, set to TLS 1.2 or later, names from SANs only, and no renegotiation."""
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.hostname_checks_common_name = False
    context.options |= ssl.OP_NO_RENEGOTIATION
    return context


def client_context() -> ssl.SSLContext:
    """A client context trusting the system's roots, the server's name checked."""
    return harden(ssl.create_default_context())


def os_roots_context() -> ssl.SSLContext:
    """A client context trusting the roots OpenSSL was built with (its default CA file and
    directory), never those the environment names; the server's name checked. A system
    without them trusts no root: only a backend's own `tls.ca_file` then verifies. One
    that cannot be loaded (empty, unreadable) is skipped, as `load_default_certs` does."""
    context = harden(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    paths = ssl.get_default_verify_paths()
    locations: list[dict[str, str]] = []
    if os.path.isfile(paths.openssl_cafile):
        locations.append({"cafile": paths.openssl_cafile})
    if os.path.isdir(paths.openssl_capath):
        locations.append({"capath": paths.openssl_capath})
    for location in locations:
        try:
            context.load_verify_locations(**location)
        except OSError:  # ssl.SSLError too: an empty file, one without certificates
            continue
    return context
