"""A response's head and its first body bytes in one write.

uvicorn writes a response's head as soon as the app sends `http.response.start`, and
its body on `http.response.body`: two sends per whole answer, two TCP segments, two
wake-ups of the client, where one would do. `HeadCoalescer` stands in for the
connection's transport in one request's `RequestResponseCycle` (`gateway/listener.py`):
the cycle's first write (the head) is held until its next write (the body, in the same
turn of the event loop for every answer the gateway sends whole) or until the end of the
loop's turn (a stream's head, whose first chunk may be seconds away), whichever comes
first. Bytes keep their order: anything else the cycle writes or closes goes after the
held head. The listener's own answers (refusals) are never written into an answer in
progress (`LimitedHttpProtocol._refuse` holds one until the answers end, or closes),
and they flush first what the cycle still holds: the head of an answer to HEAD (no body
write carries it) or a `100 Continue` (a cycle's first write too). uvloop reads a
socket, and so may refuse the next bytes, before it runs the turn's callbacks. Once the
held write went out (`passed`), a stream's relay gives the cycle the connection's own
transport back (`BodyWriter.ready`, gateway/body_writer.py): the rest of the stream's
chunks skip a Python frame that would only pass each on.

A write to a connection already closing is dropped, and the cycle marked disconnected
(`mark_lost`, gateway/body_writer.py, given by the listener): uvloop closes a connection
the client reset at once and tells the protocol (`connection_lost`) only on a later
turn, and a write in between raised `RuntimeError` ("the handler is closed"). A whole
answer's send failed with it: the request ended as a gateway fault, its completion
record saying 500 and committing to an answer the client never got, where a client that
left is recorded 499 with none. Half of the answers to pipelined requests whose client
reset after the first one's head were so recorded.

What it writes is counted on the connection's `ConnectionLoss` (`sent`, given by the
listener): an earlier answer's wait for its tail (`BodyWriter.taken`) tells its own bytes
from the ones written behind them.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.body_writer import ConnectionLoss

__all__ = ["HeadCoalescer"]


class HeadCoalescer:
    """What a `RequestResponseCycle` uses of its transport (`write`, `close`,
    `is_closing`), holding its first write back for at most the loop's current turn."""

    __slots__ = ("_count", "_cycle", "_held", "_loop", "_lost", "_started", "_transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        cycle: Any = None,
        lost: Callable[[Any], None] | None = None,
        count: ConnectionLoss | None = None,
    ) -> None:
        """`lost(cycle)` is called when a write finds the connection closing; what goes
        out is counted on `count` (see the module)."""
        self._transport = transport
        # weak: the cycle holds this as its transport
        self._cycle = None if cycle is None else weakref.ref(cycle)
        self._lost = lost
        self._loop = loop
        self._held: bytes | None = None
        self._started = False
        self._count = count

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():  # lost (see the module): nothing goes out
            self._held = None
            self._started = True
            self._gone()
            return
        held = self._held
        if held is not None:
            self._held = None
            data = held + data
        elif not self._started:
            self._started = True
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)
        if self._count is not None:  # (see the module; written out: once per answer)
            self._count.sent += len(data)

    def passed(self) -> asyncio.Transport | None:
        """The connection's transport, once the held write went out: nothing is held
        after that, so writing to it directly keeps the order (None while a write is held
        or before the first one)."""
        return self._transport if self._started and self._held is None else None

    def flush(self) -> None:
        """Write what is held now (a no-op once the connection is closing)."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)
                if self._count is not None:
                    self._count.sent += len(held)
            else:
                self._gone()

    def _gone(self) -> None:
        cycle = None if self._cycle is None else self._cycle()
        if cycle is not None and self._lost is not None:
            self._lost(cycle)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        """What the connection still buffers, the held write included."""
        held = self._held
        return self._transport.get_write_buffer_size() + (0 if held is None else len(held))
