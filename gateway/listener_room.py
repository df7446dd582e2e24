"""Room at a listener's connection cap: which open connection makes way for a new one.

Every listener of the gateway (the public one and the admin API's, `gateway/listener.py`)
takes its connections before any key or token is checked. Closing each connection past
the cap let one client hold them all with heads sent slowly, silent sockets, or the
unread bodies of requests refused with 401, reconnecting at each deadline: measured, 250
slow heads from one address against `max_connections: 200` left 0 of 27 requests served.

So a connection past the cap drops one that waits for a request of its own to be
answered (`Room.wait`: idle, its head still arriving, or the rest of an answered
request's body coming in; `Room.busy` once a head is complete), and is served. Which one:

- the peer holding the most waiting connections gives one up (its address; an IPv6
  address by its /64, which one host usually holds whole), so that a client flooding
  the listener from one address drops its own connections first, never the idle
  keep-alive or the head in progress of a client holding fewer;
- of that peer's, the one that has waited longest (a refused connection, only sending
  its answer and dropping what still comes, goes first).

A connection whose request is being answered is not dropped while its client reads
what it is sent. When no connection waits, one whose client has stopped reading its
answer (`Room.stall`: the transport paused writing, its buffers full; `Room.unstall` once
it resumes) is dropped instead, the one stalled longest first: else a client with no key
could hold every connection "being answered" by pipelining requests with large keyless
answers (the admin API's `/openapi.json`) and reading none, each until `write_timeout_s`.
The price: an honest client reading a large answer or a stream slower than it is sent
(its writes paused at that moment) can lose it to a newcomer at the cap. When no
connection waits or stalls, the new connection is closed at once, unread.

A connection counts as waiting once its answer is complete for the server, which is when
the last bytes are handed to the transport, not when the client has them: a whole answer
goes out in one write, most of it still in the transport's buffer. `make_room` passes
over a waiting connection whose transport still holds bytes (aborting it would cut off
the answer) and keeps it aside (`_sending`) until its writes resume (`unstall`: it waits
again) or its next head comes. One whose buffer empties without its writes having paused
stays aside until its next request or its end (the keep-alive timeout). While its writes
are paused it is also stalled, and dropped as one when no connection waits.

What that guarantees: a connection is dropped only when no peer holds more waiting
connections than its own and it is its peer's oldest; once its head is complete it is
dropped only while its client reads nothing of its answer and no connection waits.
Sources that each hold as few connections as an honest client (many addresses, or every
client behind one proxy or load balancer, which counts as one peer)
meet an order that is about oldest first: to drop a request whose head arrives at once,
they must open about as many connections as the cap in the moment it takes to arrive.
An honest peer holding many idle keep-alives (a pool) gives up its oldest ones first
when the flood holds fewer per address: its next request there meets a closed connection.
Not covered: a request being answered to a client that reads is never dropped, so a
holder of a valid key can still fill the cap with slow bodies (each up to
`body_timeout_s`) or long streams read as they come; a keyless request is answered 401
before its body is read, and then waits like any other.

Cost: the waiting connections of each peer are an `OrderedDict` in the order they began
waiting, one removal and one insertion per request. The peers by how many connections
they hold (`_by_size`, to find the fullest at once) are kept only while the listener is
full: built at the first `take` (O(peers)), updated in O(1) per change from then on, and
dropped once half the connections it was built with have ended, so a listener below its
cap pays nothing for it and each build is paid for by as many connections made. The
stalled connections are one `OrderedDict` in the order they stalled: one insertion when
a transport pauses writing and one removal when it resumes or the connection ends, none
for a client that reads its answers as they come.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from gateway.body_writer import cut

__all__ = ["Peer", "Room", "peer_key"]

_ABSENT = object()


def peer_key(client: tuple[str, int] | None) -> Hashable:
    """What groups a connection's peer: its IPv4 address, the /64 of its IPv6 address (an
    IPv4-mapped one as that IPv4 address), or None (a Unix socket)."""
    if client is None:
        return None
    host = client[0]
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:  # not an address we can group (a scope id, say): as it is
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return address.packed[:8]


class Peer:
    """One peer's connections on one listener: how many are open (`members`), and those
    that wait for a request, oldest first (`waiting`)."""

    __slots__ = ("key", "members", "waiting")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.members = 0
        self.waiting: OrderedDict[Any, None] = OrderedDict()


class Room:
    """The waiting connections of one listener (see the module docstring). A connection is
    any hashable object: the listener's protocol instances, in tests plain objects."""

    __slots__ = ("_by_size", "_largest", "_low", "_members", "_peers", "_sending", "_stalled")

    def __init__(self) -> None:
        self._peers: dict[Hashable, Peer] = {}
        self._members = 0  # connections joined and not yet left
        # While full: _by_size[n] holds the peers holding n waiting connections, in the
        # order they got to n; `_largest` is the most one holds. None: not full lately.
        self._by_size: list[OrderedDict[Peer, None]] | None = None
        self._largest = 0
        self._low = 0  # the index is dropped when fewer connections than this are left
        # Connections whose client reads nothing of what it is sent, longest first.
        self._stalled: OrderedDict[Any, None] = OrderedDict()
        # Connections passed over by `make_room` while their answer was still going out,
        # and their peers: waiting again once their writes resume (`unstall`).
        self._sending: dict[Any, Peer] = {}

    def join(self, key: Hashable, connection: Any) -> Peer:
        """The peer `key` of `connection`, just made: counted until `leave`, and waiting."""
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = Peer(key)
        peer.members += 1
        self._members += 1
        self.wait(peer, connection)
        return peer

    def leave(self, peer: Peer, connection: Any) -> None:
        """`connection` of `peer` has ended."""
        self.busy(peer, connection)
        self._stalled.pop(connection, None)
        peer.members -= 1
        if not peer.members:
            del self._peers[peer.key]
        self._members -= 1
        if self._members < self._low:
            self._by_size = None  # half the connections are gone: not full any more
            self._low = 0

    def wait(self, peer: Peer, connection: Any, *, first: bool = False) -> None:
        """`connection` waits for a request from now on: the newest of its peer's, or
        with `first` the oldest (a refused connection, whose end is near anyway)."""
        waiting = peer.waiting
        if connection not in waiting:
            waiting[connection] = None
            if self._by_size is not None:
                self._resized(self._by_size, peer, len(waiting) - 1)
        if first:
            waiting.move_to_end(connection, last=False)

    def busy(self, peer: Peer, connection: Any) -> None:
        """A request of `connection` is being answered: it is never dropped."""
        waiting = peer.waiting
        if waiting.pop(connection, _ABSENT) is not _ABSENT and self._by_size is not None:
            self._resized(self._by_size, peer, len(waiting) + 1)
        if self._sending:  # empty unless the cap passed over a connection still sending
            self._sending.pop(connection, None)

    def stall(self, connection: Any) -> None:
        """`connection`'s client reads nothing of what it is sent (its writes are paused):
        it may be dropped when no connection waits, the one stalled longest first."""
        self._stalled[connection] = None

    def unstall(self, connection: Any) -> None:
        """`connection`'s client reads again (its writes resumed)."""
        self._stalled.pop(connection, None)
        if self._sending:
            peer = self._sending.pop(connection, None)
            if peer is not None:  # passed over while its answer went out: waiting again
                self.wait(peer, connection)

    def take(self) -> Any | None:
        """The connection to drop to make room, no longer counted as waiting (or stalled);
        None when no connection waits or stalls."""
        taken = self._take()
        return None if taken is None else taken[0]

    def _take(self) -> tuple[Any, Peer | None] | None:
        """What `take` gives, with the peer it waited in (None: a stalled one)."""
        by_size = self._by_size
        if by_size is None:
            by_size = self._index()
        largest = self._largest
        if not largest:
            if self._stalled:
                connection, _ = self._stalled.popitem(last=False)
                return connection, None
            return None
        peer = next(iter(by_size[largest]))
        connection, _ = peer.waiting.popitem(last=False)
        self._resized(by_size, peer, largest)
        return connection, peer

    def make_room(self, connections: set[Any]) -> bool:
        """Drop the connection `take` names from `connections` (the server's: uvicorn's
        protocol instances) and abort it; False when none waits. One already closing is
        passed over (it is leaving, its answer may still be unsent), and so is a waiting one
        whose transport still holds some of its last answer (`_sending`): its client may be
        reading it, and `abort` would cut it off. Each connection taken left the waiting
        ones (or the stalled) when taken, so the work is one step per `wait` (or `stall`)."""
        while (taken := self._take()) is not None:
            connection, peer = taken
            transport = connection.transport
            if peer is not None and transport.get_write_buffer_size():
                self._sending[connection] = peer
            elif not transport.is_closing():
                connections.discard(connection)  # its `connection_lost` comes on a later turn
                cut(connection)  # `close` would wait for a client that reads nothing
                return True
        return False

    def waiting_counts(self) -> dict[Hashable, int]:
        """How many connections wait, by peer (for tests and diagnostics: O(peers))."""
        return {key: len(peer.waiting) for key, peer in self._peers.items() if peer.waiting}

    def _index(self) -> list[OrderedDict[Peer, None]]:
        """Index the peers by how many connections they hold (see the module docstring)."""
        by_size: list[OrderedDict[Peer, None]] = [OrderedDict()]
        for peer in self._peers.values():
            held = len(peer.waiting)
            while len(by_size) <= held:
                by_size.append(OrderedDict())
            if held:
                by_size[held][peer] = None
        self._by_size = by_size
        self._largest = len(by_size) - 1
        self._low = self._members // 2
        return by_size

    def _resized(self, by_size: list[OrderedDict[Peer, None]], peer: Peer, before: int) -> None:
        """`peer` held `before` waiting connections and now holds one more or one less."""
        after = len(peer.waiting)
        if before:
            del by_size[before][peer]
        if after:
            if after == len(by_size):
                by_size.append(OrderedDict())
            by_size[after][peer] = None
            if after > self._largest:
                self._largest = after
        if before == self._largest and not by_size[before]:
            self._largest = after  # counts move by one: `after` holds this peer, or is 0
