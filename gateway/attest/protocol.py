"""The sidecar's HTTP/1.1 listener: one asyncio protocol per client connection, httptools
parsing, no ASGI.

The sidecar relays one request at a time per connection and adds a signature: uvicorn's
protocol and the ASGI messages around it cost more CPU per request than the rest of the
sidecar together (docs/performance.md). This protocol parses a request, hands it whole
(`Request`) to the relay and writes what the relay answers straight to the transport.

It enforces the limits of the gateway's own listener (`gateway/listener.py`, whose
`ListenerLimits`, refusal answers and messages it shares), counted the same way:

- `max_connections` open connections: one past it is closed before any byte is read;
- `max_header_bytes` / `max_headers`: 431 `headers_too_large` (a head still arriving is
  counted as its bytes come in, so memory stays bounded by the limit plus one read);
- `header_timeout_s`: a head must be complete this long after the connection opened or
  its first byte arrived (nothing sent: closed quietly; a partial head: 408);
- `body_timeout_s`: the body must be complete this long after its head (408);
- `keepalive_timeout_s`: an idle connection between requests is closed quietly;
- a body over the relay's `max_body` (declared or arriving): 413 `request_too_large`;
- malformed framing: 400 `invalid_request` as an OpenAI error object; chunk framing or
  trailer bytes past `max_header_bytes`: 431; trailer fields and protocol upgrades: 400.

Every refusal is a JSON error with `connection: close`, then the write side is shut and
what the client still sends is dropped for a bounded time (`LINGER_S`, `LINGER_BYTES`).
A client that leaves while its request runs: `left` turns true and the upstream answer
the relay registered (`upstream`) is aborted, so the backend stops and nothing is signed.
Pipelined requests wait their turn with reading paused.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

import httptools

from gateway.errors import ErrorCode, GatewayError
from gateway.listener import (
    LINGER_BYTES,
    LINGER_S,
    NO_TRAILERS,
    NO_UPGRADE,
    ListenerLimits,
    Refusal,
    Refusals,
    framing_message,
    refusal_answer,
    too_long_message,
    too_many_message,
)
from gateway.logs import get_logger
from gateway.upstream.http import UpstreamResponse

__all__ = ["Connection", "Listener", "Request"]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 413: b"Payload Too Large"}


class Request:
    """One complete request: method, target (path and query), headers (names in lower
    case, in order), body, and whether the connection stays open after it."""

    __slots__ = ("body", "headers", "keep_alive", "method", "target")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive


Handler = Callable[["Connection", Request], Awaitable[None]]


class Listener:
    """What the connections of one listening socket share: the relay, the limits, the
    refusal counts and the open connections (to drain them at shutdown)."""

    def __init__(
        self, handler: Handler, limits: ListenerLimits, max_body: int, keepalive_s: float
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.max_body = max_body
        self.keepalive_s = keepalive_s
        self.refusals = Refusals()
        self.connections: set[Connection] = set()
        self.draining = False  # shutting down: no request after the running ones
        self.errors = 0  # relay failures that were not GatewayErrors
        self._events = get_logger("owngate.attest")

    def failed(self, exc: Exception) -> None:
        self.errors += 1
        self._events.error("relay failed", reason=type(exc).__name__, detail=str(exc)[:200])

    def protocol(self) -> Connection:
        return Connection(self)

    def close_idle(self) -> None:
        """At shutdown: close every connection that is not running a request."""
        for connection in list(self.connections):
            connection.close_if_idle()


def _status_line(status: int) -> bytes:
    reason = _REASONS.get(status)
    if reason is None:
        from http import HTTPStatus

        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, reason)


_STATUS = {status: _status_line(status) for status in (200, 201, 204, 400, 404, 500)}


class Connection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    transport: asyncio.Transport

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._limits = listener.limits
        self._loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.left = False  # the client went away
        self.upstream: UpstreamResponse | None = None  # aborted when the client leaves
        self.task: asyncio.Task[None] | None = None  # the relay of the current request
        self._refused = False
        self._in_head = True
        self._head_begun = False
        self._head_bytes = 0
        self._read_len = 0
        self._body_read = 0
        self._framing = 0
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._body_size = 0
        self._pipeline: collections.deque[Request] = collections.deque()
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._linger_left = -1
        self._active_at = 0.0  # loop time of the last request's end: the idle clock
        self._writable: asyncio.Future[None] | None = None
        self._write_paused = False
        self._keep_alive = True
        self._started = False  # the current request's answer has begun
        self._answered = True  # ... and was written in full

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        listener = self._listener
        if len(listener.connections) >= self._limits.max_connections:
            self._refused = True
            listener.refusals.note("max_connections", self._loop.time())
            transport.close()
            return
        listener.connections.add(self)
        self._head_timer = self._loop.call_later(self._limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self.left = True
        self._listener.connections.discard(self)
        for timer in (self._head_timer, self._body_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._idle_timer = None
        if self.upstream is not None:
            self.upstream.abort()
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._linger_left >= 0:  # refused: drop what still comes, within bounds
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.transport.close()
            return
        self._read_len = len(data)
        in_body = not self._in_head
        if in_body:
            self._body_read = 0
        else:
            self._head_bytes += self._read_len
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refusal = exc.__context__
            if isinstance(refusal, Refusal):
                self._refuse(refusal.code, refusal.reason, refusal.message)
            else:
                self._refuse(ErrorCode.invalid_request, "framing", "Invalid HTTP request.")
            return
        except httptools.HttpParserUpgrade:
            self._refuse(ErrorCode.invalid_request, "upgrade", NO_UPGRADE)
            return
        except httptools.HttpParserError as exc:
            self._refuse(ErrorCode.invalid_request, "framing", framing_message(exc))
            return
        if self._in_head:
            if self._head_begun:  # a head is still arriving
                limit = self._limits.max_header_bytes
                if self._head_bytes > limit:
                    self._refuse(
                        ErrorCode.headers_too_large, "header_bytes", too_long_message(limit)
                    )
                elif self._head_timer is None:
                    self._head_timer = self._loop.call_later(
                        self._limits.header_timeout_s, self._head_late
                    )
        else:  # a body is still arriving
            if in_body and self._framing_too_long():
                return
            if self._body_timer is None:
                self._body_timer = self._loop.call_later(
                    self._limits.body_timeout_s, self._body_late
                )

    # parser callbacks

    def on_message_begin(self) -> None:
        self._head_begun = True
        self._target = b""
        self._headers = []
        self._body = []
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:  # a chunked body's trailer fields: refused, as the gateway does
            raise Refusal(ErrorCode.invalid_request, "trailers", NO_TRAILERS)
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        limits = self._limits
        if len(self._headers) > limits.max_headers:
            raise Refusal(
                ErrorCode.headers_too_large, "header_count", too_many_message(limits.max_headers)
            )
        if self.parser.should_upgrade():
            raise Refusal(ErrorCode.invalid_request, "upgrade", NO_UPGRADE)
        limit = limits.max_header_bytes
        if (self._head_bytes > limit or self._read_len > limit) and self._head_size() > limit:
            raise Refusal(ErrorCode.headers_too_large, "header_bytes", too_long_message(limit))
        if not self._target.startswith(b"/"):
            raise Refusal(ErrorCode.invalid_request, "framing", "Invalid request target.")
        expect_continue = False
        for name, value in self._headers:
            if name == b"content-length":
                if value.isdigit() and (len(value) > 20 or int(value) > self._listener.max_body):
                    raise self._too_large()
            elif name == b"expect" and value.lower() == b"100-continue":
                expect_continue = True
        self._in_head = self._head_begun = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if expect_continue and self.task is None:
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_read += len(body)
        self._body_size += len(body)
        if self._body_size > self._listener.max_body:
            raise self._too_large()
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._framing = 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        body = self._body
        request = Request(
            self.parser.get_method(),
            self._target,
            self._headers,
            body[0] if len(body) == 1 else b"".join(body),
            self.parser.should_keep_alive(),
        )
        if self.task is None:
            self.task = self._loop.create_task(self._run(request))
        else:  # pipelined: it waits its turn, and nothing more is read meanwhile
            self._pipeline.append(request)
            self.transport.pause_reading()

    # running requests

    async def _run(self, request: Request) -> None:
        handler = self._listener.handler
        while True:
            self._keep_alive = request.keep_alive and not self._listener.draining
            self._started = self._answered = False
            try:
                await handler(self, request)
            except GatewayError as error:
                if not self._started:
                    self.respond(error.status, error.body(), b"application/json")
            except Exception as exc:  # noqa: BLE001 - a relay bug must not hang the client
                self._listener.failed(exc)
                if not self._started:
                    error = GatewayError(ErrorCode.internal_error, "the sidecar failed")
                    self.respond(error.status, error.body(), b"application/json")
            self.upstream = None
            if not self._answered or not self._keep_alive or self.left:
                if not self.left:
                    self.transport.close()
                self.task = None
                return
            if not self._pipeline:
                break
            request = self._pipeline.popleft()
            if not self._pipeline:
                self.transport.resume_reading()
        self.task = None
        self._active_at = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self._listener.keepalive_s, self._idle_late)

    def close_if_idle(self) -> None:
        if self.task is None and not self._head_begun:
            self.transport.close()

    # answering (called by the relay)

    def respond(self, status: int, body: bytes, content_type: bytes, extra: bytes = b"") -> None:
        """A whole answer; `extra` is more header lines, each ending in CRLF."""
        if self.left:
            return
        head = b"%scontent-type: %s\r\ncontent-length: %d\r\n%s%s\r\n" % (
            _STATUS.get(status) or _status_line(status),
            content_type,
            len(body),
            extra,
            b"" if self._keep_alive else b"connection: close\r\n",
        )
        self.transport.write(head + body)
        self._started = self._answered = True

    def start_stream(self, status: int, content_type: bytes) -> None:
        """The head of a chunked answer; then `send_chunk` and `end_stream`."""
        if self.left:
            return
        self._started = True
        self.transport.write(
            b"%scontent-type: %s\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n%s\r\n"
            % (
                _STATUS.get(status) or _status_line(status),
                content_type,
                b"" if self._keep_alive else b"connection: close\r\n",
            )
        )

    async def send_chunk(self, data: bytes) -> None:
        if self.left or not data:
            return
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        if self._write_paused:  # the client reads slower than the backend sends
            self._writable = self._loop.create_future()
            await self._writable
            self._writable = None

    def end_stream(self, last: bytes) -> None:
        if self.left:
            return
        self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
        self._answered = True

    # limits

    def _too_large(self) -> Refusal:
        limit = self._listener.max_body
        return Refusal(
            ErrorCode.request_too_large,
            "body_bytes",
            f"The request body exceeds the limit of {limit} bytes.",
        )

    def _framing_too_long(self) -> bool:
        """As the gateway's listener: chunk-size lines and trailers past the head limit."""
        if self._body_read:
            self._framing = self._read_len - self._body_read
        else:
            self._framing += self._read_len
        limit = self._limits.max_header_bytes
        if self._framing <= limit:
            return False
        self._refuse(
            ErrorCode.headers_too_large,
            "framing_bytes",
            f"The request's chunk framing or trailer fields exceed {limit} bytes.",
        )
        return True

    def _head_size(self) -> int:
        size = len(self.parser.get_method()) + len(self._target) + 13
        for name, value in self._headers:
            size += len(name) + len(value) + 4
        return size

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._head_begun:  # nothing sent: close quietly
            self._listener.refusals.note("idle_timeout", self._loop.time())
            self.transport.close()
            return
        self._refuse(
            ErrorCode.request_timeout,
            "header_timeout",
            f"The request head did not arrive within {self._limits.header_timeout_s:g} s.",
        )

    def _body_late(self) -> None:
        self._body_timer = None
        self._refuse(
            ErrorCode.request_timeout,
            "body_timeout",
            f"The request body did not arrive within {self._limits.body_timeout_s:g} s.",
        )

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

    def _refuse(self, code: ErrorCode, reason: str, message: str) -> None:
        """Answer `code` (unless another answer is in progress) and close."""
        self._listener.refusals.note(reason, self._loop.time())
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None
        if self.task is not None:  # a second answer on the wire would corrupt the first
            self.transport.close()
            return
        self.transport.write(refusal_answer(code, message, []))
        self._linger_left = LINGER_BYTES
        self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._loop.call_later(LINGER_S, self.transport.close)
