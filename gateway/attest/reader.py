"""Reading HTTP/1.1 requests within the gateway listener's limits, for the sidecar's own
listener (`gateway/attest/protocol.py`, which answers them).

`RequestReader` is the asyncio protocol's reading half: httptools parsing, and the limits
of the gateway's listener (`gateway/listener.py`; its `ListenerLimits`, refusal
answers and messages, in `gateway/listener_limits.py`, are shared), counted the same way:

- `max_connections` open connections: one past it drops a connection waiting for a
  request, else one whose client reads nothing of its answer, as the gateway's listener
  does (`Room`, gateway/listener_room.py), else it is closed before any byte is read;
- `max_header_bytes` / `max_headers`: 431 `headers_too_large` (a head still arriving is
  counted as its bytes come in, so memory stays bounded by the limit plus one read);
- `header_timeout_s`: a head must be complete this long after the connection opened or
  its first byte arrived (nothing sent: closed quietly; a partial head: 408);
- `body_timeout_s`: the body must be complete this long after its head (408);
  while the sidecar itself holds the next request back (`held_back`: reading paused while
  a request waits its turn, `100 Continue` owed until the running request is answered),
  either deadline starts over;
- a body over `max_body` (declared or arriving): 413 `request_too_large`;
- bodies held at once by all connections together, over `max_held` (`BodyBudget`,
  gateway/body_budget.py, as the gateway's `limits.max_held_body_bytes`): 429
  `rate_limit_exceeded` with `retry-after: 1`, counted from a body's declared length
  before any of it is read (a chunked body: as it arrives); a request's bytes are given
  back when its answer ends (`Request.held`), or when the connection ends first;
- malformed framing, a Transfer-Encoding other than `chunked` alone (or on an HTTP/1.0
  request) or a target that is not a path: 400 `invalid_request` as an OpenAI error
  object; chunk framing or trailer bytes past `max_header_bytes`: 431; trailer fields
  and protocol upgrades: 400.

Every refusal is a JSON error with `connection: close`, then the write side is shut and
what the client still sends is dropped for a bounded time (`LINGER_S`, `LINGER_BYTES`);
while an answer is being written the connection is closed instead. A request that passed
goes to `request_complete` whole (`Request`, gateway/attest/request.py).
"""

from __future__ import annotations

import asyncio
import sys

import httptools

from gateway.attest.request import Request
from gateway.body_budget import BodyBudget, Held
from gateway.errors import ErrorCode, GatewayError
from gateway.listener_limits import (
    LINGER_BYTES,
    LINGER_S,
    NO_TRAILERS,
    NO_UPGRADE,
    ListenerLimits,
    Refusal,
    Refusals,
    framing_message,
    head_size,
    refusal_answer,
    refuse_framing,
    too_long_message,
    too_many_message,
)
from gateway.listener_room import Peer, Room, peer_key

__all__ = ["RequestReader"]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class RequestReader(asyncio.Protocol):
    """Parses requests on one connection within `limits`; a subclass answers them
    (`request_complete`) and sets `task` while it does."""

    transport: asyncio.Transport

    def __init__(
        self,
        limits: ListenerLimits,
        refusals: Refusals,
        max_body: int,
        connections: set[RequestReader],
        bodies: BodyBudget | None = None,
        max_held: int = sys.maxsize,
        room: Room | None = None,
    ) -> None:
        self._limits = limits
        self._room = room if room is not None else Room()  # `connections`' room at the cap
        self._peer: Peer  # this connection's, from `connection_made` (unless refused)
        self._bodies = bodies or BodyBudget()
        self._max_held = max_held
        self._held: Held | None = None  # the body being read's share of `bodies`
        self._refusals = refusals
        self._max_body = max_body
        self._connections = connections
        self._loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.task: asyncio.Task[None] | None = None  # answering a request
        self._refused = False  # closed at once by the connection cap
        self._in_head = True  # the next bytes belong to a request head
        self._head_begun = False  # ... and some of them have arrived
        self._head_bytes = 0  # bytes of reads that began inside the current head
        self._read_len = 0  # length of the read being parsed
        self._body_read = 0  # body bytes the current read delivered
        self._framing = 0  # body-phase bytes since the last body bytes
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        # The body: its first piece as it came (the common case: all of it, no copy), then
        # one buffer. Never a list of pieces: a body of 2-byte chunks would hold ~22 bytes
        # of memory per body byte.
        self._body = b""
        self._more: bytearray | None = None
        self._body_size = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._linger_left = -1  # bytes still dropped after a refusal; -1: not refused
        self.continue_owed = False  # `100 Continue` waits for the running request's answer

    def request_complete(self, request: Request) -> None:
        raise NotImplementedError

    def abandon(self) -> None:
        """The running request's answer will not reach the client whole: stop it."""

    def held_back(self) -> bool:
        """Whether the sidecar, not the client, holds the next request's bytes back."""
        return self.continue_owed

    @property
    def reading(self) -> bool:
        """Whether a request head has begun arriving."""
        return self._head_begun

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self._connections) >= self._limits.max_connections:
            made = self._room.make_room(self._connections)  # dropped one waiting or stalled
            self._refusals.note("evicted" if made else "max_connections", self._loop.time())
            if not made:
                self._refused = True
                transport.close()
                return
        self._connections.add(self)
        peer = transport.get_extra_info("peername")
        self._peer = self._room.join(peer_key(peer if isinstance(peer, tuple) else None), self)
        self._head_timer = self._loop.call_later(self._limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        if not self._refused:
            self._room.leave(self._peer, self)
        self._release()
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

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
                self._refuse(refusal.code, refusal.reason, refusal.message, refusal.headers)
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
        self._release()
        self._held = self._bodies.hold(self._max_held)
        self._head_begun = True
        self._target = b""
        self._headers = []
        self._body = b""
        self._more = None
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:  # a chunked body's trailer fields: refused, as the gateway does
            raise Refusal(ErrorCode.invalid_request, "trailers", NO_TRAILERS)
        headers = self._headers
        if len(headers) >= self._limits.max_headers:  # held as objects: refused as it grows
            limit = self._limits.max_headers
            raise Refusal(ErrorCode.headers_too_large, "header_count", too_many_message(limit))
        headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        limits = self._limits
        if self.parser.should_upgrade():
            raise Refusal(ErrorCode.invalid_request, "upgrade", NO_UPGRADE)
        limit = limits.max_header_bytes
        if (self._head_bytes > limit or self._read_len > limit) and (
            head_size(self.parser.get_method(), self._target, self._headers) > limit
        ):
            raise Refusal(ErrorCode.headers_too_large, "header_bytes", too_long_message(limit))
        if not self._target.startswith(b"/"):
            raise Refusal(ErrorCode.invalid_request, "framing", "Invalid request target.")
        refuse_framing(self._headers, self.parser.get_http_version())
        expect_continue = False
        for name, value in self._headers:
            if name == b"content-length":
                if value.isdigit() and (len(value) > 20 or int(value) > self._max_body):
                    raise self._too_large()
                if value.isdigit():  # held before any of it is read
                    self._cover(int(value))
            elif name == b"expect" and value.lower() == b"100-continue":
                expect_continue = True
        self._in_head = self._head_begun = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._room.busy(self._peer, self)  # not dropped at the cap unless it stops reading
        if expect_continue:
            if self.task is None:
                self.transport.write(_CONTINUE)
            else:  # after the running request's answer (`send_continue`)
                self.continue_owed = True

    def on_body(self, body: bytes) -> None:
        self._body_read += len(body)
        self._body_size += len(body)
        if self._body_size > self._max_body:
            raise self._too_large()
        held = self._held  # a declared length is held already (on_headers_complete)
        if held is not None and self._body_size > held.size:  # past it: a chunked body
            self._cover(self._body_size)
        if self._more is not None:
            self._more += body
        elif self._body:
            self._more = bytearray(self._body)
            self._more += body
        else:
            self._body = body

    def on_message_complete(self) -> None:
        self._in_head = True
        self.continue_owed = False
        self._head_bytes = 0
        self._framing = 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        body, more = self._body, self._more
        self._body, self._more = b"", None  # not held past the request (an idle connection)
        held, self._held = self._held, None  # the request's now: released with its answer
        self.request_complete(
            Request(
                self.parser.get_method(),
                self._target,
                self._headers,
                body if more is None else bytes(more),
                self.parser.should_keep_alive(),
                held,
                self.parser.get_http_version() == "1.0",
            )
        )

    def send_continue(self) -> None:
        """The `100 Continue` owed to a request that came while another ran."""
        if self.continue_owed:
            self.continue_owed = False
            self.transport.write(_CONTINUE)

    # limits

    def _cover(self, size: int) -> None:
        """Hold `size` bytes of the body being read against the listener's budget."""
        held = self._held
        if held is None:
            return
        try:
            held.cover(size)
        except GatewayError as exc:
            message = (
                "The sidecar holds as many request bodies as it may at once "
                "(--max-held-body-bytes); retry shortly."
            )
            raise Refusal(exc.code, "held_body_bytes", message, tuple(exc.headers)) from None

    def _release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None

    def _too_large(self) -> Refusal:
        limit = self._max_body
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

    def _head_late(self) -> None:
        self._head_timer = None
        if self._head_begun and self.held_back():
            self._head_timer = self._loop.call_later(self._limits.header_timeout_s, self._head_late)
            return
        if not self._head_begun:  # nothing sent: close quietly
            self._refusals.note("idle_timeout", self._loop.time())
            self.transport.close()
            return
        self._refuse(
            ErrorCode.request_timeout,
            "header_timeout",
            f"The request head did not arrive within {self._limits.header_timeout_s:g} s.",
        )

    def _body_late(self) -> None:
        self._body_timer = None
        if self.held_back():
            self._body_timer = self._loop.call_later(self._limits.body_timeout_s, self._body_late)
            return
        self._refuse(
            ErrorCode.request_timeout,
            "body_timeout",
            f"The request body did not arrive within {self._limits.body_timeout_s:g} s.",
        )

    def _refuse(
        self,
        code: ErrorCode,
        reason: str,
        message: str,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        """Answer `code` (unless another answer is in progress) and close."""
        self._refusals.note(reason, self._loop.time())
        self._release()  # the refused body is not kept: its bytes are dropped from now on
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None
        if self.task is not None:  # a second answer on the wire would corrupt the first
            self.abandon()
            self.transport.close()
            return
        self.transport.write(refusal_answer(code, message, list(headers)))
        self._linger_left = LINGER_BYTES
        self._room.wait(self._peer, self, first=True)  # the first of its peer's to drop
        self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._loop.call_later(LINGER_S, self.transport.close)
