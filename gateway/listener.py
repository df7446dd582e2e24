"""The public HTTP/1.1 listener: uvicorn's httptools protocol with limits on what a
client connection may hold.

uvicorn's `HttpToolsProtocol` buffers a request head of any size (httptools keeps a
header value that never ends in memory, growing it by copies), has no deadline on a
request head or body (only on an idle keep-alive connection after a response) and no cap
on open connections. A public listener needs all of them, so that silent sockets,
slowloris senders and endless headers cannot exhaust memory, file descriptors or the
listener itself. `http_protocol(listen)` returns the protocol class that uvicorn runs per
connection (`uvicorn.Config(http=...)` accepts a class); `gateway.serving.uvicorn_config`
uses it for every server, with `listen.*` from gateway.yaml (docs/configuration.md):

- `max_connections` open client connections per process (default: half of the open-file
  limit after a headroom, `derived_max_connections`): a connection past it drops one
  waiting for a request, else one whose client reads nothing of its answer
  (`gateway/listener_room.py`), else it is closed unread.
- `max_header_bytes` (the request line and header lines) and `max_headers`: past them
  the answer is 431 `headers_too_large`. A head still arriving is counted as its bytes
  come in, so memory stays bounded by the limit plus one read.
- `header_timeout_s`: a request head must be complete this long after the connection
  opened (the first request) or after its first byte (later requests on a keep-alive
  connection, empty lines before a request line included; the idle time between
  requests is uvicorn's `timeout_keep_alive`). A connection that sent nothing (or empty
  lines only) is closed quietly (a pooled idle connection must not
  find an unrequested answer), a partial head gets 408 `request_timeout`.
- `body_timeout_s`: the whole body must arrive this long after the head. The clock
  is the protocol's, not the app's, so it also bounds bodies no handler reads (an early
  401, an unknown path) and costs nothing when head and body come in one read; while the
  gateway itself holds the body back (reading paused by flow control, `100-continue`
  not yet sent) the deadline starts over. Past it: 408 `request_timeout` when no answer
  has started, else the connection is closed.
- `write_timeout_s`: a client that reads nothing of what it is sent (the transport paused
  writing: its buffers are full) this long is cut off, and the app sees it gone (uvicorn
  waits for it without limit, and a stream's relay with it, holding its backend). So is
  one that takes none of an answer's last bytes this long, fewer than pause writing
  (`_watch_tail`): a close after the answer would wait for them without end.
- a started stream's body may be written without `send`: each request's scope holds a
  `BodyWriter` (`gateway/body_writer.py`, key `owngate.body_writer`) for the private
  relay's per-chunk writes, framed as `send` frames them.
- framing errors (a malformed request line, header or chunked body, an HTTP version
  other than 1.0 and 1.1, a Transfer-Encoding but `chunked` alone or on HTTP/1.0, two
  Host fields) get 400 `invalid_request`, a Content-Encoding but `identity` 415
  `unsupported_media_type`: OpenAI error objects, not uvicorn's plain text.
- a stream to an HTTP/1.0 request ends with the connection (`gateway/close_delimited.py`).
- chunked bodies: the bytes between body data (a chunk-size line, its extensions, the
  trailer section) are held to `max_header_bytes` too (431), since the parser buffers a
  trailer field as it buffers a header; a request that carries trailer fields at all is
  400 `invalid_request` (uvicorn would add them to the request's headers after the app
  read them: a data-class label could arrive after the policy looked).
- an answer to a request that asked for `100 Continue`, before its body was asked for (an
  early 401, 413), ends the connection (`gateway/expect_continue.py`): the client sends no
  body then, and its next request would otherwise be read as that body.
- pipelining: at most `MAX_PIPELINED` requests queued behind the one being answered; a
  connection that sends more gets 400 after their answers, and is closed: uvicorn
  parses every request of a read, so one connection could queue requests without end. Its
  loss tells the request being answered too, not only the newest (uvicorn's `cycle`).
- a body answered before it was read (an early 401, 413, 429) is not kept with the cycle.
- protocol upgrades (`Upgrade` with `Connection: upgrade`, `CONNECT`) are 400: the parser
  stops at such a head, and its body would otherwise be parsed as a request of its own.

Every refusal is a JSON OpenAI error object with `connection: close` (that of a head
after requests still being answered waits for their answers: closing at once lost them);
then the write side is shut and what the client still sends is dropped for a bounded
time (`LINGER_S`, `LINGER_BYTES`): closing with unread bytes resets the connection,
which can destroy the answer unread. Refusals are logged at most every `_LOG_EVERY_S`,
never per event.

Cost on the hot path: timers are the loop's `call_later` handles, never tasks. A request
whose head (and body) arrive in one read arms none: the head timer is armed once per
connection and after that only for a head or body left incomplete at the end of a read.
Per request the protocol adds a few attribute updates, one pass over the headers and five
Python frames (about 1% of the gateway's CPU; the room two `Room` calls, and the count of
where its answer ends, `_answer_ended`), and hands a body that arrived in one read to the
app uncopied (`gateway/listener_body.py`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httptools
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.body_writer import (
    BODY_WRITER_SCOPE_KEY,
    BodyWriter,
    client_lost,
    mark_lost,
)
from gateway.close_delimited import close_delimited
from gateway.coalescing import HeadCoalescer
from gateway.errors import ErrorCode
from gateway.expect_continue import close_unless_continued
from gateway.listener_body import hold_piece
from gateway.listener_limits import (
    MAX_PIPELINED,
    NO_TRAILERS,
    NO_UPGRADE,
    TOO_MANY_PIPELINED,
    ListenerLimits,
    Refusal,
    Refusals,
    cancel,
    framing_message,
    framing_too_long_message,
    head_size,
    refuse_framing,
    too_long_message,
    too_many_message,
)
from gateway.listener_refusal import RefusingProtocol
from gateway.listener_room import Room, peer_key

if TYPE_CHECKING:
    from gateway.config.schema import ListenSettings

__all__ = ["LimitedHttpProtocol", "http_protocol"]


def http_protocol(listen: ListenSettings) -> type[LimitedHttpProtocol]:
    """The protocol class for one server: `LimitedHttpProtocol` bound to the limits of
    `listen` and to its own refusal counts."""
    limits = ListenerLimits.from_config(listen)
    namespace: dict[str, Any] = {"limits": limits, "refusals": Refusals(), "room": Room()}
    return type("OwngateHttpProtocol", (LimitedHttpProtocol,), namespace)


class LimitedHttpProtocol(RefusingProtocol):
    """uvicorn's httptools protocol with owngate's limits; use `http_protocol(listen)`."""

    # connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            made = self.room.make_room(self.connections)  # dropped one waiting for a request
            self.refusals.note("evicted" if made else "max_connections", self.loop.time())
            if not made:
                self._refused = True
                transport.close()
                return
        super().connection_made(transport)
        self._peer = self.room.join(peer_key(self.client), self)  # `Peer`, until its end
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        if exc is None:  # not a reset (`_note_taken`): before the transport drops its buffer
            self._note_taken()
        self.room.leave(self._peer, self)
        # uvicorn's keep-alive timer too: it cancels it at a clean end only (not a reset)
        cancel(self._head_timer, self._body_timer, self._linger_timer, self._write_timer)
        cancel(self.timeout_keep_alive_task)
        self._head_timer = self._body_timer = self._linger_timer = self._write_timer = None
        self.timeout_keep_alive_task = None
        super().connection_lost(exc)
        # An answer's tail still unsent is lost with it: every request of the connection
        # waiting for its answer to be taken learns it (the earlier one of a pipelined or
        # keep-alive pair included), not only its newest (`cycle`) or `answering`.
        self.loss.lost = True
        client_lost(self.cycle)  # the proxy's disconnect watch (gateway/body_writer.py)
        # pipelined: uvicorn tells its newest cycle only, not the one being answered
        if self.answering is not None and not self.answering.response_complete:
            mark_lost(self.answering)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self.answering = cycle
        super()._start_asgi_task(cycle, app)

    def pause_writing(self) -> None:
        super().pause_writing()
        cancel(self._write_timer)  # an earlier answer's tail's (`_watch_tail`), if any
        self._write_timer = self.loop.call_later(self.limits.write_timeout_s, self._write_late)
        self.room.stall(self)  # droppable at the cap when none waits (listener_room.py)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self.room.unstall(self)
            self._write_timer.cancel()
            self._write_timer = None
        if self.cycle is not None and self.cycle.response_complete:
            self._watch_tail()  # the answer ended while paused: what is left has one too

    def data_received(self, data: bytes) -> None:
        if self._linger_left >= 0:  # refused: drop what still comes, within bounds
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.transport.close()
            return
        self._read_len = len(data)
        in_body = not self._in_head
        self._body_read = 0
        self._begun_in_read = False
        if self._read_heads:
            self._read_heads = []
        prior = 0 if in_body else self._head_bytes  # of the head this read began in
        if not in_body:
            self._head_bytes += self._read_len
        idle = self.timeout_keep_alive_task is not None  # between requests: see below
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refusal = exc.__context__
            if isinstance(refusal, Refusal):
                self._refuse(refusal.code, refusal.reason, refusal.message)
            else:  # uvicorn's own callbacks rejected the head (e.g. an unparsable URL)
                self._refuse(ErrorCode.invalid_request, "framing", "Invalid HTTP request.")
            return
        except httptools.HttpParserUpgrade:
            # Refused in `on_headers_complete`; never parse what follows as a request.
            self._refuse(ErrorCode.invalid_request, "upgrade", NO_UPGRADE)
            return
        except httptools.HttpParserError as exc:
            self._refuse(ErrorCode.invalid_request, "framing", framing_message(exc))
            return
        if self._in_head:
            if self._head_begun:  # a head is still arriving
                if self._begun_in_read:  # after a request ended in this read
                    # its lines: the request line, a field per header, one not yet
                    # handed over (`on_header` comes when the next begins), a partial one
                    lines = len(self.headers) + 3
                    self._head_bytes = last_lines(data, self._past_heads(prior), lines)
                limit = self.limits.max_header_bytes
                if self._head_bytes > limit:
                    self._refuse(
                        ErrorCode.headers_too_large, "header_bytes", too_long_message(limit)
                    )
                elif self._head_timer is None:
                    self._head_timer = self.loop.call_later(
                        self.limits.header_timeout_s, self._head_late
                    )
            elif idle and self._head_timer is None:
                # Only empty lines, which the parser skips before a request line without
                # beginning a head, and uvicorn's keep-alive timer is cancelled by any
                # read: with no deadline left, `\r\n` after an answer held the connection
                # open for good. Timed as a head from here (closed quietly if none begins).
                self._head_timer = self.loop.call_later(
                    self.limits.header_timeout_s, self._head_late
                )
        else:  # a body is still arriving
            if self._framing_too_long(data, prior):
                return
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)

    # parser callbacks

    def on_message_begin(self) -> None:
        self._head_begun = self._begun_in_read = True
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            # A chunked body's trailer fields: uvicorn would append them to the headers after
            # the app read them (a label "arriving" after the policy looked); dropped, a label
            # sent there would read as "no label". Refused (OpenAI clients send none).
            raise Refusal(ErrorCode.invalid_request, "trailers", NO_TRAILERS)
        if len(self.headers) >= self.limits.max_headers:
            # Held as objects (~25 times a short field's bytes): counted as they come.
            raise Refusal(
                ErrorCode.headers_too_large,
                "header_count",
                too_many_message(self.limits.max_headers),
            )
        super().on_header(name, value)

    def on_body(self, body: bytes) -> None:
        self._body_read += len(body)
        if self.parser.should_upgrade() or not hold_piece(self.cycle, body, self.flow):
            super().on_body(body)  # uvicorn's: appended (gateway/listener_body.py)

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade():
            # No other protocol is spoken (`ws="none"`). As plain HTTP, the parser would stop
            # at the head: its body would be read later as a request of its own (smuggled
            # past a proxy in front, with its own key and labels).
            raise Refusal(ErrorCode.invalid_request, "upgrade", NO_UPGRADE)
        if len(self.pipeline) >= MAX_PIPELINED:
            # uvicorn parses every request of a read and reads again after each answer: one
            # connection could queue requests without end. Those queued wait their turn:
            # closing is the only answer that cannot overtake theirs.
            raise Refusal(ErrorCode.invalid_request, "pipelined", TOO_MANY_PIPELINED)
        limit = self.limits.max_header_bytes
        # `_head_bytes` is exact for a head that spans reads, and an upper bound when
        # it ends inside a read (body bytes follow it): count exactly only then.
        if (self._head_bytes > limit or self._read_len > limit) and (
            head_size(self.parser.get_method(), self.url, self.headers) > limit
        ):
            raise Refusal(ErrorCode.headers_too_large, "header_bytes", too_long_message(limit))
        self._read_heads.append((self.parser.get_method(), self.url, self.headers))
        version = self.parser.get_http_version()
        refuse_framing(self.headers, version)
        super().on_headers_complete()  # may raise too (a URL it cannot parse): still a head
        if version == "1.0":  # no chunked framing for it (gateway/close_delimited.py)
            close_delimited(self.cycle)
        # The head of the answer goes out with its first body bytes (gateway/coalescing.py).
        self.cycle.transport = HeadCoalescer(  # type: ignore[assignment]
            self.transport, self.loop, self.cycle, mark_lost, self.loss
        )
        # A stream's relay may write its chunks without `send` (gateway/body_writer.py).
        self.cycle.scope[BODY_WRITER_SCOPE_KEY] = BodyWriter(self.cycle, self.loss)  # type: ignore[typeddict-unknown-key]
        if self.cycle.waiting_for_100_continue:  # rare: no cost for other requests
            close_unless_continued(self.cycle)
        self._in_head = self._head_begun = False
        cancel(self._head_timer)
        self._head_timer = None
        self.room.busy(self._peer, self)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if cycle.response_complete and cycle.body:
            # Answered before its body was read (an early 401, 413, 429): uvicorn keeps what
            # it buffered (up to one read past 64 KiB) until the next request or the end.
            cycle.body = bytearray()
        self._answer_ended()  # before the next request's task starts (`answering`)
        super().on_response_complete()  # (may close: `connection: close`)
        self._watch_tail()  # an unread tail below the pause mark: deadline too
        # Waiting again, unless a pipelined request is answered now (the newest cycle).
        if self.cycle.response_complete and not self.transport.is_closing():
            if self._after_answers is not None:  # the refusal of the head after them
                cancel(self.timeout_keep_alive_task)
                self.timeout_keep_alive_task = None
                if isinstance(self.cycle.transport, HeadCoalescer):
                    self.cycle.transport.flush()  # a HEAD answer's head goes first
                self._write_own(self._after_answers)
                self._linger()
                return
            self.room.wait(self._peer, self)

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._framing = 0
        cancel(self._body_timer)
        self._body_timer = None
        super().on_message_complete()

    def _past_heads(self, prior: int) -> int:
        """The bytes of this read that are neither body bytes nor part of a head that
        ended in it (`head_size`, spaces around values not counted, so a little more may
        be counted; of the first such head, `prior` bytes came in earlier reads): the
        framing after the body bytes, or the head this read ends inside. Only reads that
        began in a head were counted for a head, the count reset when a request ended,
        and only reads that began in a body for framing: a pipelined head that came with
        the previous request's end, or framing that came with the head, was never
        counted (up to a read, 256 KiB), and heads past the limit were served."""
        part = self._read_len - self._body_read
        for place, head in enumerate(self._read_heads):
            part -= head_size(*head) - (prior if place == 0 else 0)
        return part

    def _framing_too_long(self, data: bytes, prior: int) -> bool:
        """Refuse (431) a chunked body whose bytes between body data grow past the head
        limit: a chunk-size line, its extensions or trailer fields the parser would
        otherwise buffer without bound. Body bytes start the count over, so many small
        chunks are fine; a read that carried body data, or a head's end, counts the
        framing it ends with (`last_lines`), a read of framing alone adds up."""
        framing = self._past_heads(prior)
        if self._body_read or self._read_heads:
            self._framing = last_lines(data, framing, 2)
        else:
            self._framing += framing
        limit = self.limits.max_header_bytes
        if self._framing <= limit:
            return False
        self._refuse(ErrorCode.headers_too_large, "framing_bytes", framing_too_long_message(limit))
        return True


def last_lines(data: bytes, most: int, lines: int) -> int:
    """What to count of the run that ends `data`, of at most `most` bytes (what is neither
    body nor a head that ended in it): its bytes after the `lines`-th line feed from the
    end, when all of those lie among its last `most` bytes, else `most`. `lines` is 2 for
    chunk framing: all the parser may still hold or wait on after the last body byte is a
    partial chunk-size line (no line feed: one ends it), or the one trailer field a read
    may end with and a partial line (a second field is refused, `on_header`; obs-fold is
    a parse error); before them are complete lines it holds nothing of (the CRLF after
    chunk data, the last chunk's line). For a head begun in the read, one more than its
    lines (`data_received`). Counted whole, the framing between the small chunks of one
    read (a client's generator yielding a few bytes each: 6,000 chunks of 20 bytes) was
    431 when a body was still arriving at the read's end, and so was a small pipelined
    head split over reads after such a body."""
    start = end = len(data)
    floor = max(end - most, 0)
    for _ in range(lines):
        end = data.rfind(b"\n", floor, end)
        if end < 0:
            return most
    return start - end - 1
