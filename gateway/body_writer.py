"""A started stream's body written straight to the client's connection.

Through ASGI, each relayed chunk of a stream is a message dict and a `send` coroutine
(uvicorn's, with its flow-control check and chunk framing) awaited by the relay's task,
which a read from the backend had to wake first. For a stream paced one token per
write, that Python is about as much as the system calls a chunk needs. The listener
(gateway/listener.py) puts a `BodyWriter` for each request in its scope under
`BODY_WRITER_SCOPE_KEY`; the private relay (`gateway/api/passthrough.py`) uses it, once
the stream's head went out through `send`, to write each chunk from the backend
connection's read callback (`UpstreamResponse.pump`), and ends the stream through `send`
again. Servers without it (the test client, another ASGI server) get the ASGI path.

It writes what uvicorn's `send` writes for a body message (one chunk of chunked
transfer coding, through the cycle's transport, so a held head still goes first) and
keeps uvicorn's state as it is: the response stays started and unfinished until the
relay's last `send`. It holds its cycle weakly: the cycle's scope holds it, and a strong
reference back would leave every request a reference cycle that only the cyclic garbage
collector frees (a long stream's, promoted to the oldest generation while it runs, only
by a full collection).

It also tells the proxy when the client's connection is lost (`watch`): the listener
calls `lost()` where uvicorn would wake a `receive` waiting for `http.disconnect`, so a
request needs no task of its own blocked in `receive` to learn it (a task per request,
created, woken and cancelled). The callback is dropped when the request ends (`unwatch`)
or once called, so it holds the request's task no longer than the request runs.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

from gateway.coalescing import HeadCoalescer

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from gateway.asgi import Scope

__all__ = [
    "BODY_WRITER_SCOPE_KEY",
    "CHUNK",
    "BodyWriter",
    "ConnectionLoss",
    "body_writer",
    "client_lost",
    "cut",
    "drop",
    "mark_lost",
]

BODY_WRITER_SCOPE_KEY: Final = "owngate.body_writer"
# One chunk of chunked coding, `CHUNK % (len(data), data)`: what `BodyWriter.write` writes
# (and the private relay's sink, which writes each read itself: gateway/api/stream_relay.py)
CHUNK: Final = b"%x\r\n%b\r\n"
# How often `BodyWriter.taken` looks again at an answer's tail the client is reading (no
# event says when the kernel took its last byte: below the pause mark none comes at all,
# above it writing resumes below the low-water mark, which a later answer behind the tail
# may hold it above): twice as long after each look, up to `_TAIL_POLL_MAX_S`. Before, a
# paused tail waited for that resume, not seeing its end taken while a later answer held
# the buffer up: a client reset then was 499 for an answer it read. At 10 ms for good, a client
# that leaves such a tail unread woke its request 100 times a second until the write
# timeout (120 s): a few thousand such connections held the event loop's CPU.
_TAIL_POLL_S: Final = 0.01
_TAIL_POLL_MAX_S: Final = 1.0


class ConnectionLoss:
    """Whether a connection is gone (the listener's `connection_lost`): one per connection,
    shared by the `BodyWriter`s of all its requests. A request waiting for its answer to
    be taken (`BodyWriter.taken`) may no longer be the connection's newest or the one
    being answered (a pipelined or keep-alive request after it is), so a mark on the
    cycles the protocol still knows would miss it.

    It also counts the bytes handed to the connection (`sent`: through the cycles'
    `HeadCoalescer`s and the listener's own answers) and how many of them the kernel took
    (`taken_upto`): an answer ends at a count (`BodyWriter.end`) and is taken once that
    count is, whatever a later answer (pipelined, or asked before the client read this
    one's end) or the listener's refusal put in the write buffer behind it. A stream's
    chunks written past the coalescer go uncounted: only once every earlier answer was
    seen taken (`BodyWriter.ready`), and its end, written through the coalescer again
    (`guard`), is counted after them: a look at the buffer after an answer's end never
    takes uncounted bytes for counted ones that went out."""

    __slots__ = ("cut", "dropped", "ended", "lost", "sent", "taken_upto")

    def __init__(self) -> None:
        self.lost = False
        self.dropped = False  # by the server itself (`drop`): the gateway's cut
        # Aborted by the gateway itself (`cut`: a write timeout, the connection cap, `drop`):
        # what the kernel took may still be lost (closing with unread input resets).
        self.cut = False
        self.sent = 0  # bytes counted as handed to the connection (see the class)
        self.ended = 0  # the count at the latest answer's end (the listener's)
        # The count up to which the kernel took every byte: `sent` less what the write
        # buffer holds, whenever someone looks (`note`), never after `cut`; also noted by
        # the listener when the client ends the connection (EOF, a clean loss), before the
        # transport drops its buffer. Without that, a client that read an answer's last
        # bytes and closed between two looks of `BodyWriter.taken` was recorded 499.
        # -1 before any look: an answer whose bytes went uncounted (no listener counting
        # them) is taken only once a look finds the buffer empty.
        self.taken_upto = -1

    def note(self, unsent: int) -> None:
        """The write buffer holds `unsent` bytes now (its connection open, or ended by its
        client): every counted byte before them was taken by the kernel."""
        if not self.cut:
            self.taken_upto = max(self.taken_upto, self.sent - unsent)

    def look(self, transport: Any) -> bool:
        """Note what the open `transport`'s write buffer holds (`note`); whether every
        answer that ended on the connection was taken. Closing, it says nothing: a reset
        drops the buffer (the loss and the listener's `_note_taken` decide)."""
        if not transport.is_closing():
            self.note(transport.get_write_buffer_size())
        return not self.cut and self.ended <= self.taken_upto


class BodyWriter:
    """Writes body chunks of one request's response; `ready()` says when it may."""

    __slots__ = ("_cycle", "_guard", "_loss", "_on_gone", "dropped", "end")

    def __init__(self, cycle: RequestResponseCycle, loss: ConnectionLoss | None = None) -> None:
        # Weak: the request's task holds its cycle while the app runs (see the module).
        self._cycle = weakref.ref(cycle)
        self._on_gone: Callable[[], object] | None = None
        self._guard: HeadCoalescer | None = None  # the listener's, while `ready` set it aside
        # The server dropped the connection itself (`drop`): its loss is the gateway's
        # cut (503), not a client that left (499).
        self.dropped = False
        # The connection is gone, also after the response completed, when uvicorn no
        # longer marks its cycle disconnected: what its write buffer held then never
        # reached the client. Its connection's (`ConnectionLoss`).
        self._loss = ConnectionLoss() if loss is None else loss
        # `ConnectionLoss.sent` once the response's last bytes went to the connection (set
        # by the listener when it completes); None before.
        self.end: int | None = None

    @property
    def closed(self) -> bool:
        """Whether the connection is gone (`ConnectionLoss`)."""
        return self._loss.lost

    def watch(self, on_gone: Callable[[], object]) -> bool:
        """Call `on_gone` once if the client disconnects before the response ends (call
        after the body was read); False, registering nothing, when it is gone already.
        Like a `receive` after the body, it reads the connection again if reading was
        paused (a large body's last read, a pipelined request): else its loss is not seen."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return False
        self._on_gone = on_gone
        if not cycle.response_complete:
            cycle.flow.resume_reading()
        return True

    def unwatch(self) -> None:
        """Stop watching (the request is over)."""
        self._on_gone = None

    def lost(self) -> None:
        """The client disconnected: call the watcher, once."""
        on_gone, self._on_gone = self._on_gone, None
        if on_gone is not None:
            on_gone()

    def ready(self) -> bool:
        """Whether the response's head went out, with chunked framing, and its body has
        not ended: only then is a chunk written here what `send` would write.

        When it is, and the listener's `HeadCoalescer` holds nothing any more (the head
        went out with the first chunk), the cycle gets the connection's own transport
        back: every later write, `send`'s too, then skips the coalescer's Python frame,
        which did nothing but pass it on (once per chunk of a paced stream). Not while an
        earlier answer's tail is in the write buffer: its wait counts the bytes behind it
        (`ConnectionLoss`), and the coalescer counts them."""
        cycle = self._cycle()
        ready = (
            cycle is not None
            and cycle.response_started
            and cycle.chunked_encoding is True
            and not cycle.response_complete
            and not cycle.disconnected
            and cycle.scope["method"] != "HEAD"
        )
        if ready and cycle is not None and isinstance(cycle.transport, HeadCoalescer):
            transport = cycle.transport.passed()
            if transport is not None and self._loss.look(transport):
                self._guard, cycle.transport = cycle.transport, transport
        return ready

    def guard(self) -> None:
        """The relay writes no more chunks here: the cycle's writes go through the
        listener's `HeadCoalescer` again (`ready` set it aside; it holds nothing now), so
        that what `send` still writes (the stream's end, an error event, a last flushed
        piece) to a connection reset and not yet told is dropped and the client marked
        gone (`mark_lost`), where the connection's own transport raised (uvloop). It is
        also what makes the stream's wait (`taken`) true: the chunks written past the
        coalescer went uncounted (`ConnectionLoss`), and only the end, counted after
        them, ends the stream past the count a look at an empty buffer saw taken."""
        cycle = self._cycle()
        if cycle is not None and self._guard is not None:
            cycle.transport, self._guard = self._guard, None  # type: ignore[assignment]

    def write(self, data: bytes) -> bool | None:
        """Write `data` as one chunk. None when the client is gone and nothing was written;
        else whether it can take more now: False when its buffers are full (write no more
        until `drain()` returns). Empty `data` writes nothing: an empty chunk would end
        the body. One call per chunk of a stream, so it also answers `write_paused`."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return None
        if cycle.transport.is_closing():  # reset, not yet told (gateway/coalescing.py)
            mark_lost(cycle)
            return None
        if data:
            cycle.transport.write(CHUNK % (len(data), data))
        return not cycle.flow.write_paused

    @property
    def cycle_ref(self) -> weakref.ref[RequestResponseCycle]:
        """The weak reference to the response's cycle, for a per-read check written out
        where a call per read would cost as much as its work (gateway/api/stream_relay.py)."""
        return self._cycle

    def closing(self) -> bool:
        """Whether nothing written now reaches the client: it is gone, or its connection
        was reset and the protocol not yet told (then marked lost, as `write` does). The
        relay asks before its stream's watch reads a piece: one that cannot go out is no
        usage or error event the client read."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return True
        if cycle.transport.is_closing():  # reset, not yet told (gateway/coalescing.py)
            mark_lost(cycle)
            return True
        return False

    @property
    def unsent(self) -> int:
        """Bytes handed to the connection still in its write buffer in this process (the
        kernel has not taken them: a client that stopped reading, its socket buffers
        full; a reset drops them unsent). uvloop writes to the socket at once when that
        buffer is empty, so none is left after a write a reading client takes."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return 0
        return cycle.transport.get_write_buffer_size()

    @property
    def gone(self) -> bool:
        """The client has disconnected: nothing more reaches it (`send` drops it too)."""
        cycle = self._cycle()
        return cycle is None or cycle.disconnected

    @property
    def head_sent(self) -> bool:
        """The response's head was handed to the connection (uvicorn wrote it)."""
        cycle = self._cycle()
        return cycle is not None and cycle.response_started

    @property
    def body_sent(self) -> bool:
        """The response's last body bytes were handed to the connection (uvicorn wrote
        them): all of a whole answer went out, not just its head."""
        cycle = self._cycle()
        return cycle is not None and cycle.response_complete

    @property
    def write_paused(self) -> bool:
        """The client's buffers are full: write no more until `drain()` returns."""
        cycle = self._cycle()
        return cycle is not None and cycle.flow.write_paused

    def close(self) -> None:
        """End the response by closing the connection, marked as the gateway's cut
        (`dropped`): for an answer whose head went out and whose body never will (a whole
        answer cut while its body waited for room), which no ASGI message can end: an
        empty last body would fall short of its content-length, and uvicorn would raise.
        Closed, not aborted: what the connection still buffers (a keep-alive connection's
        earlier answer, which its record says the client got, and this head) goes out
        first, as uvicorn's own shutdown closes a connection. The cycle counts as
        disconnected at once, as when the client leaves, so uvicorn takes the app's return
        for the end of the request, not an unfinished response."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return
        self.dropped = True
        self._on_gone = None  # the gateway's cut, not a client that left
        cycle.disconnected = True
        cycle.message_event.set()
        cycle.transport.close()

    async def taken(self) -> bool:
        """Wait until the kernel has taken every byte of this answer (none left in this
        process's write buffer, which a crash or a lost connection loses; a later answer
        or refusal behind it may be: `ConnectionLoss`): True, also when the client took it
        all and then closed (`ConnectionLoss.taken_upto`), or False when the connection was
        lost first. uvloop writes to the socket at once, so a reading client's answer is
        taken when written; one the client reads slower than it is written waits for it.
        Bounded by the listener, which drops a client that takes nothing for
        `listen.write_timeout_s` (paused or not: gateway/listener.py)."""
        cycle = self._cycle()
        poll = _TAIL_POLL_S
        loss = self._loss
        end = loss.sent if self.end is None else self.end
        while cycle is not None and not self.closed and not cycle.disconnected:
            transport = cycle.transport
            if not transport.is_closing():  # (a reset drops the buffer: the loss says)
                loss.note(transport.get_write_buffer_size())
            if end <= loss.taken_upto and not loss.cut:
                return True
            # No event says when the kernel took this answer's last byte: writing resumes
            # (paused) once the buffer is below its low-water mark, which a later answer
            # behind it may hold it above, or never paused (a tail below the pause mark).
            await asyncio.sleep(poll)
            poll = min(poll * 2, _TAIL_POLL_MAX_S)
        if end <= loss.taken_upto and not loss.cut and cycle is not None and not cycle.disconnected:
            # The client took all of it, then closed (`_note_taken`); a write of this
            # answer that found the connection closing marked its cycle lost.
            return True
        if loss.dropped:  # every request of the connection: the gateway's cut
            self.dropped = True
        return False

    async def drain(self) -> None:
        """Wait until the client may be written to again (or is gone)."""
        cycle = self._cycle()
        if cycle is not None:
            await cycle.flow.drain()


def client_lost(cycle: RequestResponseCycle | None) -> None:
    """Tell the request of `cycle` that its client is gone, if uvicorn marked it so (the
    listener's `connection_lost`, and a refusal of the body it waits for)."""
    if cycle is not None and cycle.disconnected:
        writer = body_writer(cast("Scope", cycle.scope))
        if writer is not None:
            writer.lost()


def mark_lost(cycle: RequestResponseCycle) -> None:
    """A write found `cycle`'s connection closing: reset by its client, which uvloop tells
    the protocol (`connection_lost`) only on a later turn (gateway/coalescing.py). Nothing
    more reaches the client: the cycle counts as disconnected now, as uvicorn marks it
    then (its `send` drops what follows), and its request is told (`client_lost`): a
    pipelined request's later `connection_lost` would tell the newest cycle only."""
    if not cycle.disconnected:
        cycle.disconnected = True
        cycle.message_event.set()
        client_lost(cycle)


def drop(connection: Any) -> None:
    """Drop `connection` (a uvicorn HTTP protocol) from the server's side, its request's
    loss marked as the gateway's cut (`BodyWriter.dropped`): uvicorn then sees its client
    gone, as when the client leaves, and sends to it return at once. The request being
    answered is marked too when it is not the newest (pipelined: gateway/listener.py)."""
    for cycle in (getattr(connection, "cycle", None), getattr(connection, "answering", None)):
        writer = None if cycle is None else body_writer(cast("Scope", cycle.scope))
        if writer is not None:
            writer.dropped = True
    loss = getattr(connection, "loss", None)
    if isinstance(loss, ConnectionLoss):  # and any earlier one waiting to be taken
        loss.dropped = True
    cut(connection)


def cut(connection: Any) -> None:
    """Abort `connection` (a uvicorn HTTP protocol) from the server's side: what the
    kernel took of its answers counts as taken no more (`ConnectionLoss.cut`): an abort
    with input unread resets, and the client's kernel drops what it had not read yet."""
    loss = getattr(connection, "loss", None)
    if isinstance(loss, ConnectionLoss):
        loss.cut = True
    connection.transport.abort()


def body_writer(scope: Scope) -> BodyWriter | None:
    """The request's `BodyWriter`, when its server provides one."""
    writer: Any = scope.get(BODY_WRITER_SCOPE_KEY)
    return writer if isinstance(writer, BodyWriter) else None
