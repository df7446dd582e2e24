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
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.upstream.connection import _Connection
    from gateway.upstream.http import HttpPool

__all__ = ["BackendSockets"]


class BackendSockets:
    """Open backend connections across pools (`open`), and the idle ones, oldest first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self._idle: OrderedDict[_Connection, HttpPool] = OrderedDict()

    def idle(self, pool: HttpPool, conn: _Connection) -> None:
        """`conn` went back to `pool`, unused."""
        self._idle[conn] = pool

    def taken(self, conn: _Connection) -> None:
        """`conn` left its pool's idle ones (a request took it, or it was closed)."""
        self._idle.pop(conn, None)

    def make_room(self) -> None:
        """Close idle connections, the oldest first, while `limit` are open."""
        while self.open >= self.limit and self._idle:
            conn, pool = self._idle.popitem(last=False)
            pool.drop_idle(conn)
