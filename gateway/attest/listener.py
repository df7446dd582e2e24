"""TLS on the sidecar's own listener (`owngate attest --tls-cert --tls-key [--client-ca]`).

With a client CA the sidecar is the backend's mutual-TLS endpoint: only a client whose
certificate chains to that CA (the gateway's) completes a handshake, so nothing that
bypasses the gateway gets an answer countersigned in its name, and the gateway pins the
sidecar's key (`tls.pin_spki_sha256`, docs/backend-tls.md). TLS 1.2 is the minimum and
renegotiation is refused, as on the gateway's side (`gateway/tls_options.py`); HTTP/1.1
is offered by ALPN.

The certificate, key and client CA files are each read once, as a backend's TLS files are
(gateway/tls_files.py): a regular file of at most `MAX_TLS_FILE`, refused otherwise with an
OSError naming it (the sidecar does not start), and loaded from the very bytes read.
OpenSSL opened the paths itself: a FIFO there (named by mistake, or swapped in) held the
sidecar's start waiting for a writer, and `/dev/zero` was read without end.

`TlsAcceptor` accepts its connections: one counts against the connection cap from the
moment it is accepted, its handshake included. Past the cap it drops a connection that
waits for a request, else one whose client reads nothing of its answer (`Room`,
gateway/listener_room.py, as the plain listener does); when none does (every place held
by a request being answered or a handshake still running) it is closed at once.
With the handshake left to `create_server(ssl=...)`, the cap saw a connection only once
its handshake was done, so peers that connect and never say hello (no certificate needed
for that, `--client-ca` or not) held a descriptor each for the whole handshake timeout,
as many as they could open: the sidecar ran out of descriptors for its backend, its log
and its honest clients.

A TLS connection the sidecar closes (idle past its keep-alive, `connection: close`,
shutdown) first sends what it still holds and a close_notify, then waits for the
client's close_notify: at most `SHUTDOWN_TIMEOUT_S`, after which it is dropped. The
loop's default is 30 s, during which a client that never answers kept its place under
the connection cap (an idle connection held 60 s, against 30 s for plain). The wait
covers sending what is left too, so an answer the sidecar ends by closing must be read
within it; the gateway reads its answers as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
from pathlib import Path

from gateway.attest.protocol import Listener
from gateway.attest.tls_alert import AlertingContext
from gateway.tls_files import load_ca_bundle, load_cert_chain, read_tls_file
from gateway.tls_options import harden
from gateway.upstream.tls_anchors import partial_chain

__all__ = ["SHUTDOWN_TIMEOUT_S", "TlsAcceptor", "listener_context"]

_ACCEPTS_PER_WAKE = 128  # connections taken per wake-up of the listening socket
_ACCEPT_RETRY_S = 0.5  # how long accepting pauses when accept() fails (no descriptors)
SHUTDOWN_TIMEOUT_S = 5.0  # a closed connection's last bytes and close_notify exchange
# What accept() fails with when the process or system is out of room: pause, do not spin.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def listener_context(
    cert_file: Path, key_file: Path, client_ca: Path | None = None
) -> ssl.SSLContext:
    """A server context presenting `cert_file` (PEM, may hold the chain) with its
    unencrypted `key_file`; with `client_ca`, a client certificate chaining to it is
    required: the file's CAs anchor chains as a backend's `tls.ca_file` does
    (`tls_anchors.partial_chain`), so an issuing CA named without its root admits what it
    issued and nothing its root's other CAs did. A client it refuses is sent the handshake's
    alert, so it reads why (`AlertingContext`). OSError or ssl.SSLError when a file is
    missing or does not fit (one that is not a regular file of at most `MAX_TLS_FILE`:
    OSError naming it, unread); ValueError for a `client_ca` mixing a lone CA with a root
    and a CA below it (its text names both)."""
    context = harden(AlertingContext(ssl.PROTOCOL_TLS_SERVER))
    context.set_alpn_protocols(["http/1.1"])
    cert_pem, key_pem = read_tls_file(cert_file), read_tls_file(key_file)  # never a FIFO
    # An encrypted key fails here (the empty passphrase does not open it), never prompts.
    load_cert_chain(context, cert_pem, key_pem, password=b"")
    if client_ca is not None:
        pem = read_tls_file(client_ca)  # never a FIFO, never unbounded
        # The bytes read, never the path opened again; its PEM blocks as a backend's
        # `tls.ca_file`'s, text around them (UTF-8 or not) skipped as OpenSSL's file loader
        # does (gateway/tls_files.py)
        try:
            pem = load_ca_bundle(context, pem)
        except ValueError as exc:
            raise OSError(errno.EINVAL, str(exc), str(client_ca)) from None
        # Before, a chain had to end at a self-signed root: the issuing CA the docs advise
        # naming admitted no client unless its root was in the file too, and then every
        # client certificate of the root's other CAs was admitted with it.
        if partial_chain(pem):
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class TlsAcceptor:
    """Accepts the connections of a TLS listening socket for `listener` (see the module
    docstring). Each handshake runs as a task in `listener.handshakes` for at most
    `handshake_timeout_s`; a connection whose handshake succeeds is a `Connection` of
    `listener` (made by the loop's `connect_accepted_socket`, as `create_server` would),
    one whose handshake fails or times out is closed. Closing a connection waits at most
    `shutdown_timeout_s` for its last bytes to go and the client's close_notify."""

    def __init__(
        self,
        listener: Listener,
        sock: socket.socket,
        context: ssl.SSLContext,
        handshake_timeout_s: float,
        shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
    ) -> None:
        self._listener = listener
        self._sock = sock
        self._context = context
        self._timeout = handshake_timeout_s
        self._shutdown_timeout = shutdown_timeout_s
        self._loop = asyncio.get_running_loop()
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self) -> None:
        self._retry = None
        if self._closed:
            return
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting, and end the handshakes still running."""
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for handshake in list(self._listener.handshakes):
            handshake.cancel()

    def _accept(self) -> None:
        listener = self._listener
        cap = listener.limits.max_connections
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    # A network error of one pending connection (Linux's accept() passes
                    # them on: EPROTO, ENETDOWN, ...): that connection is lost, not the
                    # listener's ability to accept.
                    continue
                # Out of descriptors (or buffers): accepting again at once would spin.
                # What is open stays served; accepting resumes a little later.
                listener.refusals.note("accept_failed", self._loop.time())
                self._loop.remove_reader(self._sock.fileno())
                self._retry = self._loop.call_later(_ACCEPT_RETRY_S, self.start)
                return
            if len(listener.handshakes) + len(listener.connections) >= cap:
                made = listener.room.make_room(listener.connections)
                listener.refusals.note("evicted" if made else "max_connections", self._loop.time())
                if not made:
                    conn.close()
                    continue
            task = self._loop.create_task(self._handshake(conn))
            listener.handshakes.add(task)
            task.add_done_callback(listener.handshakes.discard)

    async def _handshake(self, conn: socket.socket) -> None:
        # The socket is the loop's from here on: it closes it whatever happens.
        with contextlib.suppress(OSError):  # refused, timed out, or the peer left
            await self._loop.connect_accepted_socket(
                self._listener.protocol,
                conn,
                ssl=self._context,
                ssl_handshake_timeout=self._timeout,
                ssl_shutdown_timeout=self._shutdown_timeout,
            )
