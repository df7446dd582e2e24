"""One proxied request as the gateway tracks it, and helpers every relay shares (what a
relayed stream's own parts are written with: gateway/api/stream_writes.py)."""

from __future__ import annotations

import asyncio
import binascii
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.asgi import Receive, Send, send_bytes
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from gateway.api.trail import Trail
    from gateway.body_budget import Held
    from gateway.body_writer import BodyWriter
    from gateway.policy import Decision
    from gateway.state import Admission
    from gateway.tracing.spans import RequestSpan

__all__ = [
    "Exchange",
    "TryNext",
    "cancel",
    "client_left",
    "cut_status",
    "first_chunk_seconds",
    "receipt_headers",
    "receipt_headers_now",
    "relayed",
    "send_relayed",
    "send_whole",
    "settle",
    "taken",
    "watch_disconnect",
]

# A whole answer whose record is logged but whose receipt could not be signed says so
# (docs/provenance.md, "Receipts"); a stream's headers are out before, so it only lacks its
# receipt line. Either way `owngate_receipt_failures_total` counts it.
_RECEIPT_MISSING = ((b"x-owngate-receipt-missing", b"signing-failed"),)
_RECEIPT_UNSIGNED = ((b"x-owngate-receipt-missing", b"shutdown"),)  # `receipt_headers_now`

# The requests making their tenant's charge now (`settle`), each with whether a
# cancellation arrived meanwhile: `cancel` holds it back until the charge is made.
_charging: dict[asyncio.Task[Any], bool] = {}


@dataclass(slots=True)
class Exchange:
    """What the app needs to know about one proxied request once it is over."""

    request_id: bytes
    started_at: float
    endpoint: str
    tenant: str = "-"
    model: str = "-"  # a configured model name, or "<unknown>": never the client's string
    backend: str = "-"
    status: int = 0
    stream: bool = False
    response_started: bool = False
    # The answer's last ASGI message went out (`send_whole`, `end_stream`): a cancellation
    # landing after it (a shutdown's) changes nothing the client got, so nothing it says.
    ended: bool = False
    streaming: bool = False  # the response is a relayed stream (`start_stream`)
    # The client has the whole answer before its end went out: a stream's `[DONE]` event
    # (for an attested backend, with its countersignature accepted) was handed to its
    # connection. A client that leaves after it (the SDKs close at `[DONE]`) got a
    # complete answer: its record keeps the answer's status (`cut_status`), not 499.
    read_whole: bool = False
    # The last two pieces relayed to the client (references, not copies): whether a
    # stream's relayed bytes end inside an event, for what the gateway writes after them
    # (`event_break`).
    relayed_before: bytes = b""
    last_relayed: bytes = b"\n"
    client_gone: bool = False
    upstream_error: str | None = None
    # Why no backend served it (`refusal.diagnosis` of the plan's reasons): the operator's,
    # on its access line only, never the client's; None: served (or never planned).
    unserved: str | None = None
    error_code: str | None = None  # the `ErrorCode` the client got, if any
    data_class: str | None = None  # a declared class, "<unknown>" (refused) or None
    data_class_defaulted: bool = False  # no label: the policy's default_data_class applied
    policy: str = "-"  # "<id>@<version>"
    policy_digest: str = "-"
    fallback: str | None = None  # why a hosted backend served it: private_unavailable|saturated
    # With `fallback`: each eligible private backend's state that allowed it (the plan's).
    fallback_basis: tuple[tuple[str, str], ...] = ()
    provider_model: str | None = None  # a hosted attempt's model string sent to its provider
    decision: Decision | None = None
    # The refusal the client is to get once its refusal record is in the log: what a
    # shutdown's cut answers with too (`TenantSurface._cut`), as the log says.
    refused: GatewayError | None = None
    trail: Trail | None = None  # provenance state, when the log is on
    span: RequestSpan | None = None  # its trace span, when tracing is on (gateway/tracing)
    traceparent: bytes | None = None  # the current private attempt's, for its backend
    # Writes a started stream's chunks straight to the client (gateway/body_writer.py),
    # when the server provides one; else every chunk goes through `send`.
    writer: BodyWriter | None = None
    # Charges the tenant for the answer (tokens used) and frees its admission: run once,
    # before the client can see the answer end (`settle`), so a client's next request
    # is admitted against a budget that already holds this one.
    charge: Callable[[], Awaitable[None]] | None = None
    # The tenant's admission: it reserves the request's tokens once the body is parsed
    # (gateway/api/reservation.py); None: no limits apply.
    admission: Admission | None = None
    # Its share of the process's budget for whole answers (`limits.max_held_answer_bytes`,
    # gateway/api/answer_reads.py), given back when the request ends; None: not counted.
    answer: Held | None = None


class TryNext(Exception):
    """This backend failed before the client saw a byte; the next candidate may serve.

    `error` is what the client should see if no other candidate serves either; `busy`:
    the backend was up but had no room (a 429, the gateway's own connection limit), and
    `retired`: nothing was sent, its pool closed with a config a reload retired; neither
    makes a private backend unavailable for the fallback (gateway/routing/router.py).
    `withdrawn`: nothing was sent, and a reload withdrew the attempt meanwhile
    (gateway/api/decided.py): what it came to for the fallback, whatever `reason` says.
    `cut_short`: it timed out because the request's failover deadline cut its wait short
    (`Attempt.cut_short`): the deadline passed first, the backend is not unavailable."""

    def __init__(
        self,
        reason: str,
        error: GatewayError | None = None,
        *,
        busy: bool = False,
        retired: bool = False,
        withdrawn: str | None = None,
        cut_short: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error
        self.busy = busy
        self.retired = retired
        self.withdrawn = withdrawn
        # what a private one came to for the fallback: the deadline passed first
        self.came_to = "out of time" if cut_short else None


async def settle(exchange: Exchange) -> None:
    """Charge the tenant for this answer now (once): called just before the message that
    ends the answer goes out.

    No cancellation interrupts the charge: one that arrives meanwhile (`cancel`: the
    client left, the drain deadline passed) is held back until it is made, then raised
    here (`CancelledError`), as if it had arrived just after. Cancelled partway, a charge
    on Redis could be lost (the call never sent): a client closing right after `[DONE]`
    would use tokens its tenant is never charged. No task is made for it."""
    charge, exchange.charge = exchange.charge, None
    if charge is None:
        return
    task = asyncio.current_task()
    if task is None:  # not in a task: nothing can cancel it
        await charge()
        return
    _charging[task] = False
    try:
        await charge()
    finally:
        cancelled = _charging.pop(task, False)
    if cancelled:
        raise asyncio.CancelledError  # the proxy absorbs it when its client left (499)


def cancel(task: asyncio.Task[Any]) -> None:
    """Cancel `task` (a request's), or, while it makes its tenant's charge (`settle`),
    once that is made: no cancellation interrupts a charge."""
    if task in _charging:
        _charging[task] = True
    else:
        task.cancel()


async def receipt_headers(exchange: Exchange) -> tuple[tuple[bytes, bytes], ...]:
    """The receipt header of a whole answer (waits for its signature if still running);
    the tenant is charged before the answer goes out (`settle`)."""
    await settle(exchange)
    trail = exchange.trail
    receipt = await trail.sealed_receipt() if trail is not None else None
    if receipt is None:
        # The record is in the log, but its receipt could not be signed: the client is told
        # so, rather than left to take the answer for one of a gateway that gives none.
        return _RECEIPT_MISSING if trail is not None and trail.receipt_failed else ()
    return ((b"x-owngate-receipt", binascii.b2a_base64(receipt, newline=False)),)


def receipt_headers_now(exchange: Exchange) -> tuple[tuple[bytes, bytes], ...]:
    """`receipt_headers` without waiting, for an answer the gateway's forced shutdown
    gives at once: the receipt if signed already, else `x-owngate-receipt-missing:
    shutdown` once a dispatch or refusal was recorded (its receipt was still being
    signed), nothing otherwise."""
    trail = exchange.trail
    if trail is None or trail.receipt is None:
        return ()
    receipt = trail.receipt_now()
    if receipt is None:
        return _RECEIPT_MISSING if trail.receipt_failed else _RECEIPT_UNSIGNED
    return ((b"x-owngate-receipt", binascii.b2a_base64(receipt, newline=False)),)


async def send_whole(
    send: Send, exchange: Exchange, status: int, data: bytes, content_type: bytes
) -> None:
    """Send a whole answer, already fed to the trail (`relayed`), with its receipt header.

    The receipt may still be being signed: a request cancelled while it waits (the client
    left, the drain deadline cut it) sent nothing of the answer, so the trail forgets it
    (its completion record commits to no response) and the response counts as not
    started (a cut answers 503 instead, with the receipt). A client whose connection was
    lost before the answer went out (before the disconnect watcher ran) got nothing
    either: the server drops what is sent after that, so the trail forgets the answer and
    the exchange ends as a client that left: `CancelledError`, as a relayed stream's does
    (`client_left`), so that the completion record says 499, not the status the client
    never got."""
    try:
        headers = await receipt_headers(exchange)
    except asyncio.CancelledError:
        exchange.response_started = False
        if exchange.trail is not None:
            exchange.trail.unsent()
        raise
    try:
        await send_bytes(send, status, data, exchange.request_id, content_type, headers)
    except asyncio.CancelledError:
        # Cut while a send waited for a client that reads nothing (a keep-alive
        # connection's earlier answer fills its buffers): the body did not go out. Nor,
        # mostly, did the head; but after a `100 Continue` (the connection's first write)
        # the head goes out on its own, and can fill the buffers itself: then the body's
        # send waits with the head out, and the record commits to none of the answer.
        writer = exchange.writer
        if writer is not None and not writer.body_sent:
            if not writer.head_sent:
                exchange.response_started = False
            if exchange.trail is not None:
                exchange.trail.unsent()
        raise
    if client_left(exchange):
        exchange.response_started = False
        if exchange.trail is not None:
            exchange.trail.unsent()
        raise asyncio.CancelledError  # the proxy absorbs it: its client left (499)
    await _taken(exchange)
    exchange.ended = True


async def _taken(exchange: Exchange) -> None:
    """Wait until the kernel took the whole answer (`taken`) before the request counts as
    answered: its completion record says 200 and commits to the answer. Before, it was
    written while the answer could still sit in the gateway's own write buffer (a client
    reading slower than it is answered): a gateway killed then, or a connection lost
    then, left a client with part of the answer and a log saying it got all of it. A
    connection lost first ends the request as a client that left (499, committing to no
    answer: what it got is not the answer); one the gateway dropped (its forced shutdown)
    as the gateway's cut (503, the same)."""
    if not await taken(exchange):
        if exchange.trail is not None:
            exchange.trail.unsent()
        raise asyncio.CancelledError  # the proxy absorbs it (499, or the cut's 503)


async def taken(exchange: Exchange) -> bool:
    """Wait until the kernel has taken everything handed to the client's connection
    (`BodyWriter.taken`: none of it left in this process's write buffer, which a crash or
    a lost connection loses): True (at once without a writer: another ASGI server), or
    False when the connection was lost first, the client then gone (`client_gone`: 499,
    or the cut's 503 when the gateway dropped it). For a whole answer (`send_whole`) and a
    stream's end (gateway/api/stream_writes.py `end_stream`), and a stream's `[DONE]`
    before it. A shutdown's cancellation meanwhile (nothing else cancels a request whose
    answer went to its connection) is taken back and the wait goes on: the client may
    still take the answer, and the forced end drops the connection (gateway/serving.py),
    which ends the wait. Before, the cancellation ended the request as answered (200,
    committing to all of it) and the drop then threw away the tail the client had not
    taken."""
    writer = exchange.writer
    while writer is not None:
        try:
            if await writer.taken():
                return True
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            continue
        exchange.client_gone = True
        return False
    return True


def relayed(exchange: Exchange, data: bytes, *, whole: bool = False) -> None:
    """Feed relayed response bytes to the provenance trail (hash, usage); called with
    every piece the client gets (`StreamRelay`'s per-read sink writes it out)."""
    exchange.relayed_before, exchange.last_relayed = exchange.last_relayed, data
    if exchange.trail is not None:
        if whole:
            exchange.trail.answered(data)
        else:
            exchange.trail.relayed(data)


async def send_relayed(send: Send, exchange: Exchange, data: bytes) -> None:
    """Send a piece of a started stream through `send`, and feed it to the trail once it
    was handed to the client's connection: a send cancelled while it waited for the
    client to take more (the client left meanwhile), or one the server dropped because
    the client had gone (uvicorn returns without writing), sent nothing, so the record
    commits to nothing of it, as the direct relay commits to what `BodyWriter.write`
    wrote."""
    await send({"type": "http.response.body", "body": data, "more_body": True})
    if not client_left(exchange):
        relayed(exchange, data)


def cut_status(exchange: Exchange) -> tuple[int, str | None]:
    """The status and error of an attempt whose task was cancelled, or whose client's
    connection is gone: its client left (499), or the gateway shut down before the
    answer ended (503), a connection its forced shutdown dropped included. A stream whose
    `[DONE]` went out before (`read_whole`) was read whole: its status and error, as its
    end would have recorded them, whether its client left or the gateway cut it then (the
    cut then ends it without an error event, `TenantSurface._cut`)."""
    if exchange.read_whole:
        return exchange.status, exchange.upstream_error
    writer = exchange.writer
    if exchange.client_gone and (writer is None or not writer.dropped):
        return 499, "client closed the request"
    return 503, "cut: the gateway shut down before the answer ended"


def client_left(exchange: Exchange) -> bool:
    """Whether the client has gone: the disconnect watcher said so (`watch_disconnect`),
    or, before it ran, the client's connection did (then `client_gone` is set here: a
    relay that fails now ends as a client that left, 499, not as a failure it never saw)."""
    if not exchange.client_gone:
        writer = exchange.writer
        exchange.client_gone = writer is not None and writer.gone
    return exchange.client_gone


def first_chunk_seconds(exchange: Exchange) -> float:
    return time.perf_counter() - exchange.started_at


def watch_disconnect(receive: Receive, exchange: Exchange) -> Callable[[], object]:
    """Cancel the current task when the client disconnects (the relay then drops the
    backend connection, which stops the backend's work); returns what stops watching.

    On owngate's listener the connection's loss calls back (`BodyWriter.watch`): no task
    per request. Elsewhere (the test client, another ASGI server) a task awaits
    `receive` for `http.disconnect`."""
    task = asyncio.current_task()

    def gone() -> None:
        exchange.client_gone = True
        if task is not None:
            cancel(task)  # after the charge, when it is being made

    writer = exchange.writer
    if writer is not None:
        if writer.watch(gone):
            return writer.unwatch
        gone()  # already gone: cancelled at the request's next await
        return _watching_nothing

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone()
                return

    # Named: a task without a name formats one ("Task-N") when it is made.
    return asyncio.create_task(watch(), name="owngate-disconnect-watch").cancel


def _watching_nothing() -> None:
    return None
