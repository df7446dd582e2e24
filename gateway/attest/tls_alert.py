"""The sidecar tells a client it refuses why: the TLS alert of a failed handshake is sent.

uvloop's TLS protocol (like asyncio's `sslproto`) ends a connection whose handshake
failed at once, without sending what OpenSSL wrote for the peer on failing: the alert
(`certificate_required`, `unknown_ca`, `certificate_expired`, `bad_certificate`, ...).
In TLS 1.3 the client's handshake is over before the server reads its certificate, so a
gateway that `--client-ca` refuses (no client certificate, one of another CA, an expired
one) saw only its request's connection close unanswered: "closed: backend closed the
connection before answering", error kind `closed`, its breaker not opened, nothing
naming TLS. With the alert it reads `tls: tlsv13 alert certificate required` (or
`tlsv1 alert unknown ca`, `sslv3 alert certificate expired`), a fault that opens its
breaker at once (docs/backend-tls.md).

`AlertingContext` is the sidecar's server context (`listener_context`): its TLS objects
(`wrap_bio`, which both loops call) report a handshake that failed with an alert
pending as one that waits for the peer (`SSLWantReadError`), on which the loop sends
what the object holds, the alert. The failure itself is raised at the next step of the
handshake: when the peer answers (a TLS 1.3 client's request, already on its way) or
leaves, which a client that read the alert does; one that does neither is dropped at
the handshake timeout, as any handshake that stalls (`TlsAcceptor`). Nothing more is
read or written on such a connection. A failure that left nothing to send (not TLS at
all) is raised at once, as before.
"""

from __future__ import annotations

import ssl

__all__ = ["AlertingContext"]


class _AlertingObject(ssl.SSLObject):
    """A server-side TLS object whose failed handshake first lets its alert go out."""

    outgoing: ssl.MemoryBIO | None = None  # where its records go (`AlertingContext`)
    refusal: ssl.SSLError | None = None  # why its handshake failed, once it did

    def do_handshake(self) -> None:
        if self.refusal is not None:
            raise self.refusal  # the alert went out: the connection ends now
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            if self.outgoing is None or not self.outgoing.pending:
                raise
            self.refusal = exc
            raise ssl.SSLWantReadError("handshake refused: the alert is sent first") from exc


class AlertingContext(ssl.SSLContext):
    """A server context whose connections send the alert of a failed handshake before
    they are dropped (see the module docstring)."""

    sslobject_class = _AlertingObject

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        tls = super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        if isinstance(tls, _AlertingObject):
            tls.outgoing = outgoing
        return tls
