"""Relaying a private backend's stream to the client, read by read (passthrough.py opens
the attempt and hands the stream here once its answer is a 2xx `text/event-stream`).

The client sees nothing until the first chunk arrives within the attempt's first-byte
budget (until then the dispatcher may still fail over); after it, every read goes on as
it came, less the attester's countersignature comment (`SseTail`), any other `owngate-`
comment line (`CommentFilter`) and a usage chunk the client did not ask for
(`StreamWatch`). A backend failing mid-stream ends it with an error event. The trail gets
what the client read (`StreamWatch.usage`, `error_event`), also when it left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.api.attested import SseTail
from gateway.api.exchange import Exchange, client_left, first_chunk_seconds, send_relayed
from gateway.api.metrics import GatewayMetrics
from gateway.api.sse import StreamWatch
from gateway.api.sse_framing import one_data_line
from gateway.api.stream_writes import break_stream, start_stream
from gateway.asgi import Send
from gateway.body_writer import CHUNK
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.router import Attempt
from gateway.sse_comments import CommentFilter
from gateway.upstream.http import UpstreamError, UpstreamResponse

__all__ = ["StreamRelay"]

_SSE = b"text/event-stream"


class StreamRelay:
    """Relays one stream; `stripped(backend, lines)` counts the comment lines removed."""

    def __init__(self, metrics: GatewayMetrics, stripped: Callable[[str, int], None]) -> None:
        self._metrics = metrics
        self._stripped = stripped

    async def relay(
        self,
        exchange: Exchange,
        attempt: Attempt,
        response: UpstreamResponse,
        send: Send,
        first_byte_by: float,
        watch: StreamWatch,
        tail: SseTail | None,
    ) -> tuple[str | None, bool]:
        """Relay a stream (without its countersignature comment, which `tail` takes, nor
        any other `owngate-` comment line, which `CommentFilter` removes); the caller ends
        it. Returns why it broke off, if it did, and whether the bytes relayed end in the
        middle of a line."""
        backend, answered = attempt.backend, attempt.answered
        comments = CommentFilter()

        def feed(data: bytes) -> bytes:
            return watch.feed(comments.feed(data if tail is None else tail.feed(data)))

        chunks = response.chunks(response.stream_deadline, stream=True)
        try:  # the client sees nothing until the first chunk: until then, failover is open
            async with asyncio.timeout_at(first_byte_by):
                first = await anext(chunks, None)
        except TimeoutError as exc:
            raise UpstreamError("timeout", "no first chunk from backend in time") from exc
        if first is None:  # a 200 and no body at all: nothing reached the client either
            raise UpstreamError("closed", "the stream ended before its first byte")
        attempt.first_byte()
        content_type = response.header(b"content-type") or _SSE
        await start_stream(send, exchange, response.status, content_type)
        last = b"\n"  # the last bytes the client got: what the gateway writes starts a line
        self._metrics.observe_ttft(exchange.endpoint, backend.id, first_chunk_seconds(exchange))
        answered()
        last = await _relay_chunk(send, exchange, feed(first), watch, tail) or last
        broke = None
        writer = exchange.writer
        cycle_of = writer.cycle_ref if writer is not None else None
        trail = exchange.trail
        # The trail of a private stream keeps no tail: `streamed` (below, also for a
        # client that left) gives it the usage the watch read, and `Trail.usage` never
        # parses the tail then. The sink hashes what was written and counts it.

        def sink(data: bytes) -> bool:
            """One read to the client, written from the backend connection's callback
            (`UpstreamResponse.pump`); whether the client can take more now. It runs once
            per read of a paced stream: the calls it makes are written out where a call
            would cost as much as its work (`Attempt.answered`, `writer.write`,
            `relayed`)."""
            nonlocal last
            backend.answered += 1  # alive: a busy server may answer /health late
            assert writer is not None and cycle_of is not None  # (the pump runs only with one)
            # `writer.closing()` written out (no Python frame per read; C calls only): gone,
            # or reset and not yet told: nothing goes out, so the watch reads none of it
            # (the usage the client read)
            cycle = cycle_of()
            if cycle is None or cycle.disconnected or cycle.transport.is_closing():
                writer.closing()  # (marks a reset connection lost, as `write` does)
                return True
            if tail is not None:
                data = tail.feed(data)
            if comments.clean and one_data_line(data):  # a paced server's usual read,
                # tested once, not in each filter: no comment line (the comment filter
                # would pass it), no `[DONE]`, no field but `data`
                data = watch.feed(data, True)
            else:
                data = watch.feed(comments.feed(data))
            if not data:
                return True
            # `writer.write(data)` written out, less the checks made above (nothing
            # between could change the connection): one chunk of chunked coding
            transport = cycle.transport
            transport.write(CHUNK % (len(data), data))
            if transport.is_closing():
                # The write found the connection reset: uvloop sent none of it and tells
                # the protocol only a turn later. This callback may run before the loop
                # read the client's reset in the same turn (a `[DONE]` recorded as read,
                # 200, by a client that left, 499): nothing of it is committed to.
                writer.closing()  # (marks the client lost, as `write` does)
                return True
            # `relayed(exchange, data)`, written out, less the tail the trail keeps
            exchange.relayed_before, exchange.last_relayed = exchange.last_relayed, data
            if trail is not None:
                trail.response_hash.update(data)
                trail.sent_bytes += len(data)
            last = data
            # (`[DONE]` or the backend's error event seen: is it read now?)
            if (watch.done or watch.events.error_event) and not watch.sent_done:
                _sent(exchange, watch, tail)
            return not cycle.flow.write_paused  # (full: write no more until it drains)

        try:
            if writer is not None and writer.ready():
                await chunks.aclose()
                try:
                    await response.pump(sink, writer.drain, response.stream_deadline)
                finally:  # the rest goes by `send`, guarded again (gateway/body_writer.py)
                    writer.guard()
            else:  # no writer (another ASGI server): every chunk goes by `send`
                async for data in chunks:
                    answered()
                    # `_relay_chunk` and `feed` written out: this runs once per chunk
                    if tail is not None:
                        data = tail.feed(data)
                    data = watch.feed(comments.feed(data))
                    if data:
                        await send_relayed(send, exchange, data)
                        last = data
                        _sent(exchange, watch, tail)
            if tail is not None:
                flushed = comments.feed(tail.flush())
                last = await _relay_chunk(send, exchange, watch.feed(flushed), watch, tail) or last
            flushed = watch.feed(comments.flush())
            last = await _relay_chunk(send, exchange, flushed, watch, tail) or last
            last = await _relay_chunk(send, exchange, watch.flush(), watch, tail) or last
            if watch.events.keeps_id and _unsigned(tail):
                last = await _relay_chunk(send, exchange, _id_reset(last, watch), watch, tail)
            _sent(exchange, watch, tail)  # (what the write buffer held may be out now)
            watch.end()  # the receipt line ends the client's last event
            if response.ended_by_close and not _ended(watch):
                # No framing: the close ended the body, and before `[DONE]` (or the
                # backend's error event) the close is the backend dying, not its end.
                raise UpstreamError("closed", "the stream ended without data: [DONE]")
        except UpstreamError as exc:
            if client_left(exchange):
                raise asyncio.CancelledError from exc
            self._metrics.upstream_error(backend.id, exc.kind)
            watch.end()  # what ends the backend's event before the error event ends it
            if _ended(watch) and tail is None:
                # The client's SDK stopped at an event whose data starts `[DONE]` (it read
                # a complete answer) or at the backend's error event (it raised it): the
                # failure after it (a hang past the read timeout, a cut) ends the stream
                # as its end would, never with an error event the SDK does not read and
                # a record saying 502/504 for it (one that left there is recorded so
                # too, `_sent`). A `data: [DONE]` line that is not its event's first
                # data line (`watch.done` alone) is no end to the SDK, whose JSON read of
                # that event raises. (An attested answer is whole only with the
                # countersignature that follows [DONE].)
                return None, _open(last)
            broke = exc.kind
            error = GatewayError(
                ErrorCode.upstream_error if exc.kind != "timeout" else ErrorCode.upstream_timeout,
                "the backend failed in the middle of the stream",
            )
            await break_stream(send, exchange, error)
            last = b"\n"
        finally:
            if exchange.trail is not None:  # also for a client that left: what it read
                # (first: the trail kept no tail to read a usage from without it)
                exchange.trail.streamed(watch.usage, backend_error=watch.error_event)
            self._stripped(backend.id, comments.stripped)
        return broke, _open(last)


async def _relay_chunk(
    send: Send, exchange: Exchange, data: bytes, watch: StreamWatch, tail: SseTail | None
) -> bytes:
    """Send `data` on (committed to once handed to the client); returns it."""
    if data:
        await send_relayed(send, exchange, data)
        _sent(exchange, watch, tail)
    return data


def _sent(exchange: Exchange, watch: StreamWatch, tail: SseTail | None) -> None:
    """What the watch read went to the client's connection: once that holds the event
    its SDK stops at (`[DONE]`, read as the SDK reads it: `EventReader.done`, or the
    backend's error event, which it raises) and the kernel took it (the connection's
    write buffer in the gateway's process holds none of it: `BodyWriter.unsent`; a
    client that stopped reading and resets never gets what it holds), the client has
    the whole answer (`Exchange.read_whole`), and one that leaves before the stream's
    end went out (the SDKs close at `[DONE]` or at the error they raise) is recorded as
    that end would be (200; `stream_error` names the backend's error event), not 499.
    Asked again at each later read and at the relayed bytes' end while the buffer held
    it. An attested answer is whole only with its countersignature, which follows
    `[DONE]`: `watch.sent_done` notes it, and the attempt decides once it judged the
    countersignature (gateway/api/passthrough.py)."""
    events = watch.events
    if watch.sent_done or not (events.done or events.error_event) or client_left(exchange):
        return
    writer = exchange.writer
    if writer is not None and writer.unsent:  # not the kernel's yet: maybe never sent
        return
    watch.sent_done = True
    if tail is None:
        exchange.read_whole = True


def _ended(watch: StreamWatch) -> bool:
    """Whether the client's SDK stopped reading the stream at its end: at a `[DONE]`
    event (a `data: [DONE]` line that is not its event's first `data` line is none: the
    SDK's JSON read of the joined data raises), or at the backend's error event, which
    it raises, whatever follows (a `[DONE]` line, the connection's close, a failure):
    the client saw the same in each, as did one that left there (`_sent`: 200,
    `stream_error`). Before, a close without `[DONE]` after it was `502` with the
    gateway's error event, which the SDK never reads."""
    return watch.events.done or watch.events.error_event


def _id_reset(last: bytes, watch: StreamWatch) -> bytes:
    """An `id` field with no value, on a line of its own, for a stream whose backend gave
    its events ids: the OpenAI Python SDK keeps the last one for every later event and
    dispatches one at any blank line while it is set, so the blank line that ends the
    gateway's receipt line (after a whole last event) made it raise (`json.loads("")`) at
    the end of an answer it had read whole. An empty id clears it (the SSE standard's
    `EventSource` reads it so too). It is relayed as part of the stream, so the response
    commitment covers it (docs/provenance.md); the watch reads it as the SDK does."""
    reset = (b"\n" if _open(last) else b"") + b"id\n"
    watch.events.feed(reset)
    return reset


def _unsigned(tail: SseTail | None) -> bool:
    """Whether no countersignature can cover the stream, so that the gateway may write
    bytes of its own into it (`_id_reset`): not an attested backend's, or one that came
    with no countersignature comment (an old sidecar, one that failed, none at all) or
    one that is not a well-framed last line (`b"-"`, never accepted). A comment that may
    be accepted covers the sidecar's bytes only: its `id` line is the sidecar's to write
    (gateway/attest/stream_end.py)."""
    return tail is None or tail.countersignature in (None, b"-")


def _open(last: bytes) -> bool:
    """Whether a stream whose last relayed bytes are `last` ends in the middle of a line."""
    return last[-1:] not in (b"\n", b"\r")
