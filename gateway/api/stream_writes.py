"""A relayed stream as the gateway writes its own parts of it: the head (`start_stream`),
the end with the receipt line (`end_stream`), and the events it adds, each an event of its
own after whatever the backend's last one left open (`event_break`): an error event
(`send_error_event`, `break_stream`). What is relayed between is the backend's
(gateway/api/stream_relay.py, gateway/api/hosted_relay.py)."""

from __future__ import annotations

import asyncio
import binascii

from gateway.api.exchange import Exchange, client_left, settle, taken
from gateway.asgi import Send
from gateway.errors import GatewayError

__all__ = ["break_stream", "end_stream", "event_break", "send_error_event", "start_stream"]


async def end_stream(
    send: Send,
    exchange: Exchange,
    *,
    line_open: bool = False,
    now: bool = False,
    recorded: bool = False,
) -> None:
    """End a relayed stream: its receipt as a final SSE comment line (which SSE clients
    ignore), in the same message that closes the body. The tenant is charged first
    (`settle`). `line_open`: the relayed bytes end mid-line, so a line end goes first
    (the receipt line must start a line of its own, or no client would find it).

    The receipt line is the only `owngate-` comment a client gets: the private relay
    removes any a backend wrote (gateway/sse_comments.py), and a hosted stream is
    encoded by the gateway, one JSON `data:` line per event.

    A client whose connection was lost before the end went out (before the disconnect
    watcher ran) got neither the end nor the receipt: the stream ends as one whose client
    left (`CancelledError`, recorded 499 with what it was sent), never as one that ended.

    The stream counts as ended (its completion record says so, committing to all of it)
    only once the kernel took its end (`taken`): a client that stopped reading leaves
    the stream's tail, its `[DONE]` and the receipt line in the gateway's own write buffer
    for the connection, which a lost connection or a crash loses. A connection lost first
    ends it as one whose client left (499, committing to what went out before its end,
    unless its `[DONE]` had been taken before: gateway/api/stream_relay.py `_sent`).
    Before, the record said 200 and committed to the whole stream as soon as its end
    was handed to that buffer (tests/integration/test_log_truth_stream_end_unread.py).

    `now`: at once, for the gateway's forced shutdown: no charge made first, and the
    receipt line only if the receipt was signed already. `now` and `recorded` (a cut,
    whose completion record is written already) wait for nothing after the end.

    Without a receipt line (its signing failed), the line end and blank line that end
    the backend's last event, if the relayed bytes end inside one (`event_break`): the
    record read that event, and the client's SDK dispatches it only at a blank line.
    They are in the response commitment then (the record is written after this), so a
    stream without a receipt line is committed to as received, all of it."""
    trail = exchange.trail
    if now:
        receipt = None if trail is None else trail.receipt_now()
    else:
        await settle(exchange)
        receipt = await trail.sealed_receipt() if trail is not None else None
    closing = b""
    if receipt:
        line = b": owngate-receipt " + binascii.b2a_base64(receipt, newline=False) + b"\n\n"
        if line_open:
            line = b"\n" + line
    else:  # no receipt line: the backend's last event is ended all the same, as the
        # record read it (`EventReader.finish`), so its client dispatches it too
        line = closing = event_break(exchange)
    await send({"type": "http.response.body", "body": line, "more_body": False})
    if client_left(exchange) or not (now or recorded or await taken(exchange)):
        raise asyncio.CancelledError  # the proxy absorbs it: its client left (499)
    if closing and exchange.trail is not None:  # committed to: all the client received
        exchange.trail.relayed(closing)
    exchange.ended = True


async def start_stream(send: Send, exchange: Exchange, status: int, content_type: bytes) -> None:
    """Send the headers of a relayed SSE stream; from here on errors go in-band."""
    exchange.status = status
    exchange.response_started = exchange.streaming = True
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"cache-control", b"no-cache"),
                (b"x-request-id", exchange.request_id),
            ],
        }
    )


def event_break(exchange: Exchange) -> bytes:
    """What goes before an event the gateway adds to a relayed stream, so that it is an
    event of its own: nothing after a blank line (or before any byte), else the line end
    and blank line that end the backend's event. Joined to the backend's event, an SSE
    client would read one broken event, never the gateway's."""
    tail = exchange.last_relayed
    if len(tail) < 4:
        tail = (exchange.relayed_before[-4:] + tail)[-4:]
    if tail[-1:] not in (b"\n", b"\r"):
        return b"\n\n"  # mid-line: end the line, then the event
    line = tail[:-2] if tail.endswith(b"\r\n") else tail[:-1]
    if line[-1:] in (b"", b"\n", b"\r"):
        return b""
    # After a lone CR, an LF would join it as one CRLF line end: a blank line needs two.
    return b"\n\n" if tail.endswith(b"\r") else b"\n"


async def send_error_event(send: Send, error: GatewayError, *, before: bytes = b"") -> None:
    """End a started stream with an OpenAI error event (SDKs raise it) and a clean close;
    `before`: what ends the event the stream was in (`event_break`)."""
    await send(
        {
            "type": "http.response.body",
            "body": before + b"data: " + error.body() + b"\n\n",
            "more_body": True,
        }
    )


async def break_stream(send: Send, exchange: Exchange, error: GatewayError) -> None:
    """A started stream failed: end it with `error`'s event. The request then counts as
    failed (metrics, access log, completion record) with the event's status and code,
    though the client's HTTP status line, sent before, said 200."""
    exchange.status = error.status
    exchange.upstream_error = error.code.value
    before = event_break(exchange)
    exchange.relayed_before, exchange.last_relayed = b"", b"\n\n"  # an event boundary
    await send_error_event(send, error, before=before)
