"""The sidecar's HTTP/1.1 listener: one asyncio protocol per client connection, no
uvicorn or ASGI.

The sidecar relays one request at a time per connection and adds a signature: uvicorn's
protocol and the ASGI messages around it cost more CPU per request than the rest of the
sidecar together (docs/performance.md). `Connection` reads a request within the gateway
listener's limits (`gateway/attest/reader.py`), hands it whole to the relay
(`AttestRelay`) and writes what the relay answers straight to the transport: a whole
answer (`respond`) or a chunked stream (`start_stream`, `send_chunk`, `end_stream`,
which waits while the client reads slower than the backend sends; to an HTTP/1.0
request, which knows no chunked framing, a stream ends with the connection). An answer
to HEAD (the relay refuses it) is its head alone, as HTTP requires.

A client that leaves while its request runs: `left` turns true and the upstream answer the
relay registered (`upstream`) is aborted, so the backend stops and nothing is signed; so is
one reset: a write that finds its connection closing (uvloop reports it a turn later) is
dropped, where it raised, failing the relay. Pipelined requests wait their turn with
reading paused, at most `MAX_PIPELINED` of them. A client that reads slower than it is
answered holds its next request back: no request runs (and no answer is added to what the
transport holds) while the transport has paused writing, and a client that reads nothing
for `write_timeout_s` (a stream, a waiting request, or a whole answer still in the
transport's buffer) is cut off, which aborts the backend's answer. A whole answer's share
of the relay's answer budget (`answer`, `--max-held-answer-bytes`) is given back when its
request ends, or, while the transport still holds some of it unread, once the client reads
it, leaves or is cut off. A connection idle between requests is closed after `keepalive_s`.
"""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import cast

from gateway.attest.reader import RequestReader
from gateway.attest.request import Request
from gateway.body_budget import BodyBudget, Held
from gateway.errors import ErrorCode, GatewayError
from gateway.listener_limits import ListenerLimits, Refusal, Refusals
from gateway.listener_room import Room
from gateway.logs import get_logger
from gateway.upstream.http import UpstreamResponse
from gateway.upstream.tls import spki_sha256

__all__ = ["MAX_PIPELINED", "Connection", "Listener", "Request"]


def _client_pin(transport: asyncio.BaseTransport) -> str | None:
    """The pin of the client certificate a TLS connection presented (None: none)."""
    ssl_object = transport.get_extra_info("ssl_object")
    der = None if ssl_object is None else ssl_object.getpeercert(binary_form=True)
    return None if der is None else spki_sha256(der)


# Requests that may wait behind the running one. A read's requests are all parsed at
# once (httptools cannot stop mid-read), and each costs some 25 bytes of objects per
# byte of an empty header: past this many the connection is closed, as for any request
# that cannot be answered in turn. The gateway sends one request at a time.
MAX_PIPELINED = 16


def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase.encode()
    except ValueError:
        reason = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, reason)


_STATUS: dict[int, bytes] = {int(s): _status_line(int(s)) for s in HTTPStatus}

Handler = Callable[["Connection", Request], Awaitable[None]]


class Listener:
    """What the connections of one listening socket share: the relay, the limits, the
    refusal counts, the open connections (to drain them at shutdown) and the request
    bodies they hold together (`bodies`, at most `max_held_body` bytes)."""

    def __init__(
        self,
        handler: Handler,
        limits: ListenerLimits,
        max_body: int,
        keepalive_s: float,
        write_timeout_s: float = 600.0,
        max_held_body: int = sys.maxsize,
        client_pins: frozenset[str] = frozenset(),
    ) -> None:
        self.handler = handler
        # `--client-pin`: the key (SPKI SHA-256, as pins are written) of the client
        # certificate must be one of these, besides chaining to `--client-ca`; empty: any
        # certificate of that CA good for client authentication.
        self.client_pins = client_pins
        self.bodies = BodyBudget()
        self.max_held_body = max_held_body
        self.limits = limits
        self.max_body = max_body
        self.keepalive_s = keepalive_s
        # How long a client may read nothing of what it is sent before it is cut off.
        self.write_timeout_s = write_timeout_s
        self.refusals = Refusals()
        self.connections: set[RequestReader] = set()
        self.room = Room()  # which connection makes way at the cap (gateway/listener_room.py)
        # TLS handshakes running (`gateway.attest.listener.TlsAcceptor`): under the cap too
        self.handshakes: set[asyncio.Task[None]] = set()
        self.draining = False  # shutting down: no request after the running ones
        self.errors = 0  # relay failures that were not GatewayErrors
        self._events = get_logger("owngate.attest")

    def failed(self, exc: Exception) -> None:
        self.errors += 1
        # Its traceback, every message withheld (gateway/log_tracebacks.py): a message may
        # quote the relayed request.
        self._events.error("relay failed", reason=type(exc).__name__, exc_info=exc)

    def protocol(self) -> Connection:
        return Connection(self)

    def close_idle(self) -> None:
        """At shutdown: close every connection that is not running a request."""
        for connection in list(self.connections):
            if connection.task is None and not connection.reading:
                connection.transport.close()


class Connection(RequestReader):
    """One client connection (see the module docstring)."""

    def __init__(self, listener: Listener) -> None:
        super().__init__(
            listener.limits,
            listener.refusals,
            listener.max_body,
            listener.connections,
            listener.bodies,
            listener.max_held_body,
            listener.room,
        )
        self._listener = listener
        self.left = False  # the client went away
        self.upstream: UpstreamResponse | None = None  # aborted when the client leaves
        # The running request's whole answer's share of the relay's budget: given back when
        # the request ends, or, while the transport still holds unread bytes of it, once
        # the client reads them (or is cut off after `write_timeout_s`).
        self.answer: Held | None = None
        self._unread_timer: asyncio.TimerHandle | None = None
        self._pipeline: collections.deque[Request] = collections.deque()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._active_at = 0.0  # loop time of the last request's end: the idle clock
        self._writable: asyncio.Future[None] | None = None
        self._write_paused = False
        self._keep_alive = True
        self._started = False  # the current request's answer has begun
        self._chunked = True  # ... as a chunked stream (else ended by closing)
        self._answered = True  # ... and was written in full
        self._bodiless = False  # ... answers HEAD: a head alone (RFC 9110, 9.3.2)
        self._http10 = False  # ... to HTTP/1.0: a stream is never chunked (RFC 9112, 6.1)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pins = self._listener.client_pins
        if pins and _client_pin(transport) not in pins:
            # Before a byte is read: another certificate of the CA (a backend host's
            # own, issued for client authentication too) gets nothing relayed.
            self._refused = True
            self._listener.refusals.note("client_not_pinned", self._loop.time())
            cast(asyncio.Transport, transport).abort()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        super().connection_lost(exc)
        for waiting in self._pipeline:  # never run: their bodies are given back now
            if waiting.held is not None:
                waiting.held.release()
        self._pipeline.clear()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.abandon()
        if self.task is None:  # else the request's end gives its answer back
            self._give_answer_back()

    def abandon(self) -> None:
        """The client is gone, or will not get this answer whole: nothing more is written
        or signed, and the backend's answer is aborted."""
        self.left = True
        if self.upstream is not None:
            self.upstream.abort()
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    def held_back(self) -> bool:
        return self.continue_owed or bool(self._pipeline)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._room.stall(self)  # droppable at the cap when none waits

    def resume_writing(self) -> None:
        self._write_paused = False
        self._room.unstall(self)
        if self._unread_timer is not None:  # the client took the last answer
            self._give_answer_back()
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    def request_complete(self, request: Request) -> None:
        if self.task is None:
            self.task = self._loop.create_task(self._run(request))
        else:  # pipelined: it waits its turn, and nothing more is read meanwhile
            if len(self._pipeline) >= MAX_PIPELINED:
                raise Refusal(
                    ErrorCode.invalid_request,
                    "pipelined",
                    f"More than {MAX_PIPELINED} requests were sent ahead of their answers.",
                )
            self._pipeline.append(request)
            self.transport.pause_reading()

    # running requests

    async def _run(self, request: Request) -> None:
        handler = self._listener.handler
        while True:
            if self._write_paused and not await self._drained():
                if request.held is not None:  # cut off before it ran
                    request.held.release()
                self._give_answer_back()  # the earlier answer it never read
                self.task = None
                return
            self._keep_alive = request.keep_alive and not self._listener.draining
            self._started = self._answered = False
            self._chunked = True
            self._bodiless = request.method == b"HEAD"
            self._http10 = request.http10
            try:
                await handler(self, request)
            except GatewayError as error:
                if not self._started:
                    extra = b"".join(b"%s: %s\r\n" % header for header in error.headers)
                    self.respond(error.status, error.body(), b"application/json", extra)
            except Exception as exc:  # noqa: BLE001 - a relay bug must not hang the client
                self._listener.failed(exc)
                if not self._started:
                    failure = GatewayError(ErrorCode.internal_error, "the sidecar failed")
                    self.respond(failure.status, failure.body(), b"application/json")
            finally:  # answered, refused, failed or abandoned: its body is not held now
                if request.held is not None:
                    request.held.release()
                self._answer_written()
            self.upstream = None
            if not self._answered or not self._keep_alive or self.left:
                if not self.left:
                    self.transport.close()
                self.task = None
                return
            if not self._pipeline:
                if self.continue_owed:  # (a call per request only to find none owed)
                    self.send_continue()
                break
            request = self._pipeline.popleft()
            if not self._pipeline:
                self.transport.resume_reading()
        self.task = None
        if self._in_head and not self.left:  # no head came complete meanwhile: waiting
            self._room.wait(self._peer, self)
        self._active_at = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self._listener.keepalive_s, self._idle_late)

    # answering (called by the relay)

    def respond(self, status: int, body: bytes, content_type: bytes, extra: bytes = b"") -> None:
        """A whole answer; `extra` is more header lines, each ending in CRLF."""
        if self.left or self.transport.is_closing():  # closing: reset, not yet told
            return
        head = b"%scontent-type: %s\r\ncontent-length: %d\r\n%s%s\r\n" % (
            _STATUS.get(status) or _status_line(status),
            content_type,
            len(body),
            extra,
            b"" if self._keep_alive else b"connection: close\r\n",
        )
        # An answer to HEAD (the relay's 405) says its length but carries no body: a
        # client reads none, and body bytes would be the start of its next answer.
        if self._bodiless or not body:
            self.transport.write(head)
        else:  # one writev, and the body is not copied behind its head
            self.transport.writelines((head, body))
        self._started = self._answered = True

    def start_stream(self, status: int, content_type: bytes, *, framed: bool = True) -> None:
        """The head of a chunked answer; then `send_chunk` and `end_stream`. Not `framed`
        (or to an HTTP/1.0 request): an answer that ends with the connection."""
        if self.left or self.transport.is_closing():  # closing: reset, not yet told
            return
        self._started = True
        framed = framed and not self._http10
        self._chunked = framed
        if not framed:
            self._keep_alive = False
        self.transport.write(
            b"%scontent-type: %s\r\ncache-control: no-cache\r\n%s%s\r\n"
            % (
                _STATUS.get(status) or _status_line(status),
                content_type,
                b"transfer-encoding: chunked\r\n" if framed else b"",
                b"" if self._keep_alive else b"connection: close\r\n",
            )
        )

    async def send_chunk(self, data: bytes) -> None:
        if self.left or not data or self.transport.is_closing():
            return
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        if self._write_paused:  # the client reads slower than the backend sends
            await self._drained()

    async def _drained(self) -> bool:
        """Wait until the transport takes writes again; a client that reads nothing for
        `write_timeout_s` is cut off (`left`, False)."""
        writable = self._writable = self._loop.create_future()
        timer = self._loop.call_later(self._listener.write_timeout_s, _expire, writable)
        try:
            await writable
        finally:
            timer.cancel()
            self._writable = None
        if self._write_paused and not self.left:
            # close() would wait for the client to read what is buffered: never.
            self.abandon()
            self.transport.abort()
        return not self.left

    def end_stream(self, last: bytes) -> None:
        """The last bytes; an answer that is not chunked ends when `_run` closes."""
        if self.left or self.transport.is_closing():  # closing: reset, not yet told
            return
        if self._chunked:  # a chunk of size 0 is the end: only the end when nothing is left
            self.transport.write(
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last) if last else b"0\r\n\r\n"
            )
        elif last:
            self.transport.write(last)
        self._answered = True

    def _answer_written(self) -> None:
        """The request ended: its whole answer's bytes are given back, unless the transport
        still holds some the client has not read (paused writing): then once it reads them,
        or is cut off if it reads nothing for `write_timeout_s`."""
        if self.answer is None:
            return
        if self._write_paused and not self.left:
            self._unread_timer = self._loop.call_later(
                self._listener.write_timeout_s, self._unread_late
            )
            return
        self._give_answer_back()

    def _give_answer_back(self) -> None:
        if self._unread_timer is not None:
            self._unread_timer.cancel()
            self._unread_timer = None
        if self.answer is not None:
            self.answer.release()
            self.answer = None

    def _unread_late(self) -> None:
        """The client read nothing of its answer for `write_timeout_s`: cut off (close()
        would wait for it to read what is buffered: never)."""
        self._unread_timer = None
        self.abandon()
        self.transport.abort()
        self._give_answer_back()

    def _idle_late(self) -> None:
        """Close a connection idle since its last answer for `keepalive_s` (one timer per
        idle stretch, re-armed for what is left while requests keep coming)."""
        self._idle_timer = None
        if self.task is not None or self._head_begun or self.left:
            return
        left = self._active_at + self._listener.keepalive_s - self._loop.time()
        if left > 0:
            self._idle_timer = self._loop.call_later(left, self._idle_late)
            return
        self.transport.close()


def _expire(writable: asyncio.Future[None]) -> None:
    if not writable.done():
        writable.set_result(None)
