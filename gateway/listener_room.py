"""Room at the connection cap, for the admin API's listener (`admin.listen`).

The public listener closes a connection past its cap at once, unread
(`gateway/listener.py`). The admin API's listener has the same limits with at most 32
connections (`ADMIN_MAX_CONNECTIONS`), all taken before any token is checked: a peer
that could reach it held every one with heads sent slowly, silent sockets, or the
unread bodies of requests refused with 401, reconnecting at each deadline, and kept
operators out of reload, drain and key revoke for as long as it did so.

`EvictingHttpProtocol` makes room instead. A connection past the cap drops the
connection that has waited longest for a request of its own to be answered (`waiting`:
idle, its head still arriving, or the rest of an answered request's body coming in) and
is served. A connection whose request is being answered is never dropped; when every
connection has one, the new connection is closed as before. An operator's request,
sent whole at once, gets in: a peer holding the listener must now open 32 connections
in the moment it takes to read that request, not keep 32 open.

A dropped connection is aborted (`close` would wait for a client that reads nothing) and
leaves the count at once; each is counted as the refusal reason `evicted`.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any, ClassVar

from gateway.listener import LimitedHttpProtocol
from gateway.listener_limits import ListenerLimits, Refusals

if TYPE_CHECKING:
    from gateway.config.schema import ListenSettings

__all__ = ["EvictingHttpProtocol", "evicting_http_protocol"]


def evicting_http_protocol(listen: ListenSettings) -> type[EvictingHttpProtocol]:
    """The protocol class for a server whose connections past the cap make room:
    `EvictingHttpProtocol` bound to the limits of `listen` and its own refusal counts."""
    namespace: dict[str, Any] = {
        "limits": ListenerLimits.from_config(listen),
        "refusals": Refusals(),
        "turns": itertools.count(),
    }
    return type("OwngateEvictingHttpProtocol", (EvictingHttpProtocol,), namespace)


class EvictingHttpProtocol(LimitedHttpProtocol):
    """The listener's protocol, making room at the cap (see the module docstring)."""

    turns: ClassVar[itertools.count[int]]  # one server's: the order connections began waiting

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.waited_from = 0  # its turn when it last began waiting for a request

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._make_room()
        super().connection_made(transport)  # closes this one when no room was made
        self.waited_from = next(self.turns)

    def on_response_complete(self) -> None:
        self.waited_from = next(self.turns)
        super().on_response_complete()

    @property
    def waiting(self) -> bool:
        """No request of this connection is being answered, nor waits its turn."""
        cycle = self.cycle
        return (
            not self.transport.is_closing()
            and (cycle is None or cycle.response_complete)
            and not self.pipeline
        )

    def _make_room(self) -> None:
        victim: EvictingHttpProtocol | None = None
        for connection in self.connections:
            if (
                isinstance(connection, EvictingHttpProtocol)
                and connection.waiting
                and (victim is None or connection.waited_from < victim.waited_from)
            ):
                victim = connection
        if victim is None:
            return
        self.refusals.note("evicted", self.loop.time())
        self.connections.discard(victim)  # its `connection_lost` comes on a later turn
        victim.transport.abort()
