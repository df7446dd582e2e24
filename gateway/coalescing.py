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
progress (`LimitedHttpProtocol._refuse` closes instead), and they flush first what the
cycle still holds: the head of an answer to HEAD (no body write carries it) or a
`100 Continue` (a cycle's first write too). uvloop reads a socket, and so may refuse the
next bytes, before it runs the turn's callbacks. Once the held write went out (`passed`),
a stream's relay gives the cycle the connection's own transport back
(`BodyWriter.ready`, gateway/body_writer.py): the rest of the stream's chunks skip a
Python frame that would only pass each on.
"""

from __future__ import annotations

import asyncio

__all__ = ["HeadCoalescer"]


class HeadCoalescer:
    """What a `RequestResponseCycle` uses of its transport (`write`, `close`,
    `is_closing`), holding its first write back for at most the loop's current turn."""

    __slots__ = ("_held", "_loop", "_started", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif self._started:
            self._transport.write(data)
        else:
            self._started = True
            self._held = data
            self._loop.call_soon(self.flush)

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

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()
