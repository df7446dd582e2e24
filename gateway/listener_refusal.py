"""The part of the public listener's protocol (gateway/listener.py `LimitedHttpProtocol`)
that ends a connection: the state the limits keep per connection, the head, body and write
deadlines, and a refusal, answered as an OpenAI error object (or held until the answers
before it are out) and followed by a bounded linger instead of a reset; and what a
connection's end says of its answers (`_note_taken`: taken by the kernel, all of them), and
where each answer ends in what the connection was handed (`_answer_ended`: `ConnectionLoss`)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.asgi import REFUSAL_SCOPE_KEY
from gateway.body_writer import (
    BODY_WRITER_SCOPE_KEY,
    BodyWriter,
    ConnectionLoss,
    cut,
    mark_lost,
)
from gateway.coalescing import HeadCoalescer
from gateway.errors import ErrorCode, GatewayError
from gateway.listener_limits import (
    LINGER_BYTES,
    LINGER_S,
    ListenerLimits,
    Refusals,
    cancel,
    late_message,
    refusal_answer,
)
from gateway.listener_room import Peer, Room

__all__ = ["RefusingProtocol"]


class RefusingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a connection's deadlines and refusals; the
    listener's `LimitedHttpProtocol` reads the client's bytes against the limits."""

    limits: ClassVar[ListenerLimits]
    refusals: ClassVar[Refusals]
    room: ClassVar[Room]  # one server's connections waiting for a request
    _peer: Peer  # this connection's peer in the room, from `connection_made` on

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._refused = False  # closed at once by the connection cap
        self._in_head = True  # the next bytes belong to a request head
        self._head_begun = False  # ... and some of them have arrived
        self._head_bytes = 0  # bytes of reads that began inside the current head
        self._begun_in_read = False  # a head began in the read being parsed
        # (method, url, fields) of each head that ended in the read being parsed
        self._read_heads: list[tuple[bytes, bytes, list[tuple[bytes, bytes]]]] = []
        self._read_len = 0  # length of the read being parsed
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # an answer's unread tail when `_write_timer` was armed for it
        self._linger_left = -1  # bytes still dropped after a refusal; -1: not refused
        self._body_read = 0  # body bytes the current read delivered
        self._framing = 0  # body-phase bytes since the last body bytes: chunk lines, trailers
        self.answering: RequestResponseCycle | None = None  # see `connection_lost`
        self.loss = ConnectionLoss()  # its requests' writers learn its loss from it
        self._after_answers: bytes | None = None  # a refusal held until the answers end

    # the end

    def eof_received(self) -> None:
        """The client closed its side; uvloop closes the connection after this, once its
        write buffer is out (uvicorn's does nothing more)."""
        if not self._refused:
            self._note_taken()

    def _note_taken(self) -> None:
        """The client ended the connection (its EOF, or a loss without an error: a close
        whose write buffer went out): what was handed to it, less what is left in this
        process's write buffer, the kernel took (`ConnectionLoss.note`), and the answers
        waiting for that (`BodyWriter.taken`) were taken. Asked before the transport drops
        its buffer; never after the gateway's own abort (`cut`), whose loss comes without
        an error too. A reset comes as a loss with its error: not noted, what the buffer
        held never went out."""
        self.loss.note(self.transport.get_write_buffer_size())

    def _answer_ended(self) -> None:
        """The answer being answered handed its last bytes to the connection: it ends at
        the count now (`BodyWriter.end`), which a later answer's bytes or a refusal
        written behind it do not move (`ConnectionLoss`). A head still held (an answer to
        HEAD: no body write carries it) goes now, counted in it."""
        cycle = self.answering
        if cycle is None:
            return
        if isinstance(cycle.transport, HeadCoalescer):
            cycle.transport.flush()
        self.loss.ended = self.loss.sent
        writer = cycle.scope.get(BODY_WRITER_SCOPE_KEY)  # (`body_writer`, written out)
        if isinstance(writer, BodyWriter):
            writer.end = self.loss.sent

    def _write_own(self, answer: bytes) -> None:
        """Write the listener's own answer (a refusal), counted (`ConnectionLoss.sent`)."""
        self.transport.write(answer)
        self.loss.sent += len(answer)

    # deadlines

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._head_begun:  # nothing sent: close quietly, as an idle connection
            self.refusals.note("idle_timeout", self.loop.time())
            self.transport.close()
            return
        late = late_message("head", self.limits.header_timeout_s)
        self._refuse(ErrorCode.request_timeout, "header_timeout", late)

    def _write_late(self) -> None:
        """The client read nothing for `write_timeout_s`: dropped (close() would wait)."""
        self._write_timer = None
        if not self.flow.write_paused:  # an earlier answer's tail (`_watch_tail`)
            cycle = self.cycle
            answering = (  # a later answer goes out at its pace: its pause has a deadline
                cycle.response_started
                and not cycle.response_complete
                and not self.transport.is_closing()
            )
            if answering or self.transport.get_write_buffer_size() < self._unsent:
                self._watch_tail()  # taken, or being read: (then) wait again
                return
        self.refusals.note("write_timeout", self.loop.time())
        cut(self)  # what the kernel took counts as taken no more (`ConnectionLoss.cut`)

    def _watch_tail(self) -> None:
        """An answer ended with bytes the client has not taken yet, fewer than pause the
        transport's writing (whose pause arms the write deadline): `close()` after it (a
        `connection: close`, the keep-alive timeout) waits for them without end. Each
        `write_timeout_s` in which the client takes none of them drops it, as a paused
        one (an earlier answer's tail starts over: its client asked again). Called once per
        answer: costs one buffer-size read when nothing is left."""
        if self.flow.write_paused:  # that deadline runs (`pause_writing`)
            return
        cancel(self._write_timer)
        self._write_timer = None
        self._unsent = self.transport.get_write_buffer_size()
        if self._unsent:
            self._write_timer = self.loop.call_later(self.limits.write_timeout_s, self._write_late)

    def _body_late(self) -> None:
        self._body_timer = None
        if self.flow.read_paused or self.cycle.waiting_for_100_continue:
            # The gateway holds the body back, not the client: start over.
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)
            return
        late = late_message("body", self.limits.body_timeout_s)
        self._refuse(ErrorCode.request_timeout, "body_timeout", late)

    # refusing

    def _refuse(self, code: ErrorCode, reason: str, message: str) -> None:
        """Answer `code` (when no other answer is on the wire) and close."""
        self.refusals.note(reason, self.loop.time())
        cancel(self._head_timer, self._body_timer)
        self._head_timer = self._body_timer = None
        cycle = self.cycle
        if self._in_head and cycle is not None and not cycle.response_complete:
            # A head after requests still being answered (or queued): theirs go out
            # first, then this refusal (`on_response_complete`). Closing now lost them:
            # a request sent with bytes after its body had no answer at all.
            self._after_answers = refusal_answer(code, message, self.server_state.default_headers)
            # What the client still sends is dropped, up to a head's worth (the rest of
            # this one), then the connection closes: a flood gets no more reads.
            self._linger_left = self.limits.max_header_bytes
            return
        # This request's body: was it answered already, or does it wait its turn?
        if not self._in_head and (cycle.response_started or self.pipeline):
            self.transport.close()  # a second answer on the wire would corrupt the first
            return
        if cycle is not None and isinstance(cycle.transport, HeadCoalescer):
            # A write still held this turn (a HEAD answer's head, `100 Continue`) goes first.
            cycle.transport.flush()
        if not self._in_head:
            # The app waits for this body: it reads a disconnect now, what it sends is
            # dropped, and the scope tells it what the client got.
            scope = cast("dict[str, Any]", cycle.scope)
            scope[REFUSAL_SCOPE_KEY] = GatewayError(code, message)
            mark_lost(cycle)
        self._write_own(refusal_answer(code, message, self.server_state.default_headers))
        self._linger()

    def _linger(self) -> None:
        """Send the answer and EOF, then drop what the client still sends (bounded):
        closing with unread bytes would reset the connection, and a reset can destroy
        the answer before the client reads it."""
        self._linger_left = LINGER_BYTES
        self.room.wait(self._peer, self, first=True)  # the first of its peer's to drop
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger_timer = self.loop.call_later(LINGER_S, self.transport.close)
