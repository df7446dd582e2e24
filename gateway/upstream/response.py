"""The response half of the upstream HTTP/1.1 client (`gateway/upstream/http.py`).

`UpstreamResponse` is what `HttpPool.request` returns: the status and headers once they
arrived, then the body as `chunks()` yields it, `read()` gathers it or `pump()` hands it
on, fed by the connection's parser (`_push`, `_wake`, `_fail`). It applies the client's
limits to a backend that is trusted to serve, not to behave: a read timeout between reads
(one timer per response, moved only when a read's deadline comes sooner), a deadline for
the whole answer, a byte limit for `read()`, flow control past `_HIGH_WATER` buffered
bytes; and it gives the connection back to the pool (`release`) or drops it (`abort`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.upstream.failures import OUT_OF_RESOURCES, UpstreamError, no_socket_now
from gateway.upstream.read_wait import ReadWait

if TYPE_CHECKING:
    from gateway.upstream.connection import _Connection

# OUT_OF_RESOURCES and no_socket_now: still read from here by hosted_errors.py.
__all__ = ["OUT_OF_RESOURCES", "UpstreamResponse", "no_socket_now"]

_HIGH_WATER = 256 * 1024
# The most of one read a stream's consumer (`pump()`'s sink, `chunks(stream=True)`) is
# handed at once; the rest goes on a turn of the event loop later, piece by piece. What the
# relay does with a read costs Python per line and per event (the comment filter, the
# event reader that parses every event as the client's SDK does), and a read is up to
# 256 KiB: a backend writing small events (or blank lines, or comment lines) back to back
# held the loop 0.25 s a read, and a 4 MiB burst of blank lines kept a `/healthz` beside
# it waiting 5.9 s. A piece of 16 KiB holds it some 16 ms at most (a paced stream's
# reads, and most coalesced ones, are smaller: handed on whole, as before).
PIECE = 16 * 1024


class UpstreamResponse(ReadWait):
    """The response of one upstream request; body bytes arrive as `chunks()` yields."""

    def __init__(self, conn: _Connection, read_timeout: float) -> None:
        self._conn = conn
        self._loop = conn.loop
        self._read_timeout = read_timeout
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        # The body had no length and no chunked framing: it ended when the backend closed
        # the connection, which a backend that died mid-answer does too.
        self.ended_by_close = False
        self._keep_alive = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        # One timer per response, not one per read: a read sets `_due`, and the timer is
        # moved only when that comes sooner than it fires (`_wait`, `_check_due`).
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # event-loop time the current read gives up
        self._due_what = ""
        self._error: UpstreamError | None = None
        self._released = False
        self.sent_at = 0.0  # event-loop time the request went out
        # `pump()`: while it waits, reads go straight to its sink from `_push`
        self._sink: Callable[[bytes], bool] | None = None
        self._sink_loop: asyncio.AbstractEventLoop | None = None
        # the pump's own context: the sink runs in it, not in the connection's (whichever
        # request opened the connection), so what it logs or traces is this request's
        self._sink_context: contextvars.Context | None = None
        self._sink_deadline: float | None = None
        self._sink_full = False  # the sink could take no more: reading paused
        self._sink_error: Exception | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the response runs on: its connection's, which the pool sets
        once per connection, else (a connection made elsewhere) the running loop.
        `asyncio.get_running_loop()` checks for a fork with a `getpid` system call on
        every call, which was twice per request."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    @property
    def response_deadline(self) -> float | None:
        """When a whole answer must have ended (event-loop time; None: no deadline)."""
        timeout = self._conn.pool.response_timeout
        return None if timeout is None else self.sent_at + timeout

    @property
    def stream_deadline(self) -> float | None:
        """When a stream must have ended (event-loop time; None: no deadline)."""
        timeout = self._conn.pool.stream_timeout
        return None if timeout is None else self.sent_at + timeout

    @property
    def close_delimited(self) -> bool:
        """The body has no length and no chunked framing: the backend's close ends it
        (known once the head is in; `ended_by_close` then says it did)."""
        return self._conn.close_delimited

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    # fed by the connection
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _push(self, data: bytes) -> None:
        sink = self._sink
        if sink is not None:
            # `pump()` waits: the read goes to its sink now, from the connection's read
            # callback, in the pump's context: no handle scheduled, no buffer, no
            # callback of its own per read. The connection hands on a read in one piece
            # (`_Connection.data_received`), so what a zero-delay backend writes back to
            # back is relayed in as few writes as it was read (pieces of `PIECE` at most).
            loop = self._sink_loop
            assert loop is not None and self._sink_context is not None
            due = loop.time() + self._read_timeout  # the read timeout starts over here
            deadline = self._sink_deadline
            if deadline is not None and deadline < due:
                due, self._due_what = deadline, "the answer did not end in time"
            self._due = due
            rest = b""
            if len(data) > PIECE:  # the rest of it goes on from the pump's task (`PIECE`)
                data, rest = _cut(data)
                self._chunks.append(rest)
                self._buffered += len(rest)
            try:
                more = self._sink_context.run(sink, data)
            except Exception as exc:  # noqa: BLE001 - not lost: `pump()` raises it, in its task
                self._sink_error, more = exc, False
            if not more:  # the sink is full (or failed): reading pauses, the pump wakes
                self._sink = None
                self._sink_full = True
                self._pause()
                self._wake()
            elif rest:  # reading pauses while the pump hands on the rest, a turn later
                self._sink = None
                self._pause()
                self._wake()
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._paused and self._conn.transport:
            self._paused = True
            self._conn.transport.pause_reading()
        # `_wake()` written out: this runs once per read of the body
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _pause(self) -> None:
        if not self._paused and self._conn.transport:
            self._paused = True
            self._conn.transport.pause_reading()

    def _resume(self) -> None:
        if self._paused and self._conn.transport:
            self._paused = False
            self._conn.transport.resume_reading()

    def _take(self) -> bytes:
        """What is buffered, in one piece, and the buffer emptied."""
        chunks = self._chunks
        data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
        chunks.clear()
        self._buffered = 0
        return data

    def _keep_rest(self, data: bytes) -> bytes:
        """`data`'s first piece (`_cut`), what `_take` returned when it is over `PIECE`
        bytes; the rest stays buffered. Called only then: a read within `PIECE` (a paced
        stream's every read) costs the consumer no Python frame more than `_take`."""
        data, rest = _cut(data)
        self._chunks.append(rest)
        self._buffered = len(rest)
        return data

    def _ended(self) -> bool:
        """With nothing buffered: True when the body ended (the connection goes back to
        the pool); raises the error that broke it off (the connection dropped)."""
        if self.complete:
            self.release()
            return True
        if self._error is not None:
            self.abort()
            raise self._error.again()
        return False

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    async def _wait_headers(self, timeout: float) -> None:
        while self.status == 0 and self._error is None:
            try:
                await self._wait(timeout, "no response from backend in time")
            except UpstreamError:
                self.abort()
                raise
        if self.status == 0 and self._error is not None:
            self.abort()
            raise self._error.again()

    async def chunks(
        self, deadline: float | None = None, *, stream: bool = False
    ) -> AsyncGenerator[bytes, None]:
        """Yield body bytes as they arrive; raises `UpstreamError` if the body breaks off,
        or (`timeout`) if it has not ended by `deadline` (event-loop time), however
        steadily it arrives. `stream`: a relayed stream's consumer, given at most `PIECE`
        bytes at a time, with a turn of the event loop before each further piece of what
        was buffered (reading stays paused until it is all handed on)."""
        chunks = self._chunks
        loop = self.loop
        while True:
            if deadline is not None and not self.complete and loop.time() >= deadline:
                self.abort()
                raise UpstreamError("timeout", "the answer did not end in time")
            if chunks:
                data = self._take()
                if stream and len(data) > PIECE:  # more of it: the loop turns before it
                    data = self._keep_rest(data)
                    self._pause()
                    yield data
                    await asyncio.sleep(0)
                    continue
                self._resume()
                yield data
                continue
            if self._ended():
                return
            wait, what = self._next_wait(loop, deadline)
            try:
                await self._wait(wait, what)
            except UpstreamError:
                self.abort()
                raise

    async def pump(
        self,
        sink: Callable[[bytes], bool],
        drain: Callable[[], Awaitable[None]],
        deadline: float | None = None,
    ) -> None:
        """Hand the body to `sink` as it arrives, until it ends; the limits of `chunks()`.

        While the pump waits, each read goes to `sink` from the connection's read
        callback (`_push`): no task wake-up, future, timer, generator step or scheduled
        callback per read.
        For a stream paced one token per write, those were most of the Python a relayed
        chunk cost. `sink(data)` returns whether it can take more now; when it cannot
        (the client's buffers are full), reading from the backend pauses until `drain()`
        returns. An exception from `sink` ends the pump and is raised here, as are the
        body's own failures (`UpstreamError`); the caller drops the connection then.
        A read is handed on `PIECE` bytes at a time, the loop turning between two pieces
        (reading paused until the last is handed on)."""
        loop = self.loop
        chunks = self._chunks
        while True:
            if deadline is not None and not self.complete and loop.time() >= deadline:
                self.abort()
                raise UpstreamError("timeout", "the answer did not end in time")
            if chunks:  # arrived while nobody took them, or a read's rest: hand them on
                data = self._take()
                if len(data) > PIECE:
                    data = self._keep_rest(data)
                if not sink(data):
                    self._pause()
                    await drain()
                elif chunks:  # more of what was read: the loop turns before it
                    self._pause()
                    await asyncio.sleep(0)
                continue
            if self._ended():
                return
            self._resume()
            wait, what = self._next_wait(loop, deadline)
            if self._sink_context is None:
                self._sink_context = contextvars.copy_context()
            self._sink, self._sink_loop, self._sink_deadline = sink, loop, deadline
            try:
                await self._wait(wait, what)
            except UpstreamError:
                self.abort()
                raise
            finally:
                self._sink = None
            if self._sink_error is not None:
                error, self._sink_error = self._sink_error, None
                try:
                    raise error
                finally:
                    del error  # not held by this frame, which its traceback holds
            if self._sink_full:
                self._sink_full = False
                await drain()

    async def read(
        self,
        limit: int | None = None,
        *,
        deadline: float | None = None,
        reserve: Callable[[int], None] | None = None,
    ) -> bytes:
        """The whole body, of at most `limit` bytes (default: the pool's `max_body`), by
        `deadline` (event-loop time; default: `response_deadline`). Past the limit the
        connection is dropped at once, without reading on (`UpstreamError("too_large")`),
        also when `content-length` announces more; past the deadline, it is dropped too
        (`UpstreamError("timeout")`). `reserve(size)` is told the bytes taken in so far
        before each piece is kept; what it raises ends the read (the caller aborts)."""
        if limit is None:
            limit = self._conn.pool.max_body
        if deadline is None:
            deadline = self.response_deadline
        announced = self.header(b"content-length")
        if announced is not None and announced.isdigit() and int(announced) > limit:
            self.abort()
            raise UpstreamError("too_large", f"the backend announced more than {limit} bytes")
        if self.complete and self._error is None and not self._paused:
            # The whole answer came with its head (most short answers): no generator.
            data = self._take() if self._chunks else b""
            if len(data) > limit:
                self.abort()
                raise UpstreamError("too_large", f"the answer is over {limit} bytes")
            if reserve is not None:
                reserve(len(data))
            self.release()
            return data
        parts: list[bytes] = []
        size = 0
        async with contextlib.aclosing(self.chunks(deadline)) as chunks:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    self.abort()
                    raise UpstreamError("too_large", f"the answer is over {limit} bytes")
                if reserve is not None:
                    reserve(size)
                parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Return the connection to the pool if the exchange finished cleanly."""
        if self._released:
            return
        self._released = True
        self._disarm()
        conn = self._conn
        conn.response = None
        if self.complete and self._keep_alive and not conn.closed:
            # A full sink may have paused reading on the body's last read (`pump()`): a
            # pooled connection that reads nothing would never see its next answer.
            self._resume()
            conn.pool._put_idle(conn)
        else:
            conn.close()
            conn.pool._forget(conn)

    def abort(self) -> None:
        """Drop the connection: the backend sees a disconnect and stops work on it."""
        if self._released:
            return
        self._released = True
        self._disarm()
        self._conn.response = None
        self._conn.abort()
        self._conn.pool._forget(self._conn)
        self._fail(UpstreamError("closed", "request cancelled"))


def _cut(data: bytes) -> tuple[bytes, bytes]:
    """`data` (over `PIECE` bytes) as its first piece and the rest: the piece ends after
    the last blank line (an SSE event's end) within `PIECE` bytes, else after the last line
    end there, else at `PIECE` (a relay reads a stream cut anywhere alike; this keeps its
    whole-event reads whole)."""
    end = data.rfind(b"\n\n", 0, PIECE)
    if end >= 0:
        end += 2
    else:
        end = data.rfind(b"\n", 0, PIECE) + 1 or PIECE
    return data[:end], data[end:]
