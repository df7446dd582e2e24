"""The backend connections all private pools of a process hold open, idle ones included.

The listener's connection cap (`listen.max_connections`, by default derived from the
open-file limit: gateway/listener_limits.py) keeps half of what the limit leaves for
backend connections, one per client connection whose request is running. Each pool
(`HttpPool`, one per backend) also keeps the connections its requests gave back, idle,
until the backend closes them (vLLM after 5 s, `owngate attest` after 30 s), and each
pool may hold up to `limits.max_connections_per_backend`. So a client with a key that
sent as many requests as the cap allows to one backend, then to a second, then to a
third, made the process hold three backend connections per client connection and reach
its open-file limit: new client connections were reset, the provenance log refused
appends. `BackendSockets` counts every open backend connection of the pools that share
it; a pool about to open one while the count is at `limit` first closes the connection
that has been idle longest, of any pool. Connections in use are never closed: they are
bounded by the client connections that use them.

Hosted providers' connections (LiteLLM's aiohttp connectors, one per cached client) are
counted in the same share: each connector joins the count of the process
(`share_with_hosted`, set by `GatewayApp.install`) and is asked for its open connections, in
use and idle; one about to open a connection first makes room the same way
(gateway/upstream/hosted_sockets.py), and opens it within `limits.connect_timeout_s`, as a
private pool does (`hosted_connect_timeout`). Room is made from the private pools' idle
connections first, the oldest first, then from the hosted ones', the oldest first: a
hosted connection costs a TLS handshake to open again, a private one (mostly) does not.

`received_bytes` tells how many bytes a connection's socket has received so far, read or
not: a pooled connection that received any while idle is out of step with its requests
(http.py, hosted_sockets.py), also where a TLS layer holds them unseen.
"""

from __future__ import annotations

import socket
import struct
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.upstream.connection import _Connection
    from gateway.upstream.http import HttpPool

__all__ = [
    "BackendSockets",
    "HostedConnections",
    "hosted_connect_timeout",
    "hosted_share",
    "received_bytes",
    "share_with_hosted",
]

_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)  # Linux
_BYTES_RECEIVED = 128  # the offset of struct tcp_info's tcpi_bytes_received (u64, Linux 4.1)


class HostedConnections(Protocol):
    """A hosted provider connector counted in a share."""

    def open_count(self) -> int:
        """Its open connections (and those being opened), in use and idle."""
        ...

    def oldest_idle(self) -> float | None:
        """When its oldest idle connection went idle (monotonic), None if none is."""
        ...

    def drop_oldest_idle(self) -> None:
        """Close its oldest idle connection."""
        ...


class BackendSockets:
    """Open backend connections across pools (`open`), and the idle ones, oldest first;
    and the hosted connectors that joined (`join`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self._idle: OrderedDict[_Connection, HttpPool] = OrderedDict()
        self._hosted: weakref.WeakSet[HostedConnections] = weakref.WeakSet()

    def join(self, connector: HostedConnections) -> None:
        """Count `connector`'s connections in this share (held weakly)."""
        self._hosted.add(connector)

    def total(self) -> int:
        """Open backend connections, private and hosted."""
        return self.open + sum(c.open_count() for c in list(self._hosted))

    def idle(self, pool: HttpPool, conn: _Connection) -> None:
        """`conn` went back to `pool`, unused."""
        self._idle[conn] = pool

    def taken(self, conn: _Connection) -> None:
        """`conn` left its pool's idle ones (a request took it, or it was closed)."""
        self._idle.pop(conn, None)

    def make_room(self, opening: int = 0) -> None:
        """Close idle connections, the oldest first, while `limit` are open; `opening`:
        how many of those counted are the caller's, not yet open (an aiohttp connector
        counts the one it is about to open)."""
        while self.total() - opening >= self.limit:
            if self._idle:
                conn, pool = self._idle.popitem(last=False)
                pool.drop_idle(conn)
                continue
            aged = [(c.oldest_idle(), c) for c in list(self._hosted)]
            idle = [(since, c) for since, c in aged if since is not None]
            if not idle:
                return  # all in use: bounded by the client connections using them
            min(idle, key=lambda pair: pair[0])[1].drop_oldest_idle()


# The share the hosted connectors made in this process join: the running registry's; and
# the time a hosted connection may take to open: its `limits.connect_timeout_s`.
_HOSTED_SHARE: list[BackendSockets] = []
_HOSTED_CONNECT_S: list[float] = []


def share_with_hosted(sockets: BackendSockets, connect_timeout_s: float | None = None) -> None:
    """Make the hosted connectors created from now on join `sockets`, and every hosted
    connection opened from now on (by any connector) open within `connect_timeout_s`
    (None: the connector's own timeouts only)."""
    _HOSTED_SHARE[:] = [sockets]
    _HOSTED_CONNECT_S[:] = [] if connect_timeout_s is None else [connect_timeout_s]


def hosted_connect_timeout() -> float | None:
    """The seconds a hosted connection may take to open: name lookup, TCP, a proxy's
    CONNECT and the TLS handshake (None: no bound set in this process)."""
    return _HOSTED_CONNECT_S[0] if _HOSTED_CONNECT_S else None


def hosted_share() -> BackendSockets | None:
    """The share a new hosted connector joins (None: no registry built in this process)."""
    return _HOSTED_SHARE[0] if _HOSTED_SHARE else None


def received_bytes(sock: Any) -> int | None:
    """The bytes the kernel has received on `sock` (a transport's "socket") so far, read
    or not (Linux's `TCP_INFO`); None where it does not tell.

    Over TLS the event loop's transport reads the socket into OpenSSL, which hands on
    only whole records and keeps a record's first part where no API tells (not even
    `SSLObject.pending()`): bytes a backend wrote while a connection was idle may be in
    neither the protocol nor the socket, but the kernel counted them."""
    if sock is None or _TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _BYTES_RECEIVED + 8)
    except (OSError, ValueError):
        return None
    if len(info) < _BYTES_RECEIVED + 8:
        return None  # a kernel before tcpi_bytes_received
    return int(struct.unpack_from("=Q", info, _BYTES_RECEIVED)[0])
