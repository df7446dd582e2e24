"""One attempt of a proxied request, bracketed by its provenance records (`recorded`): the
dispatch record durable before the attempt sends anything, the completion record after it
with the status the client gets (gateway/api/proxy.py makes the attempts)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gateway.api.attempt_errors import attempt_status
from gateway.api.attested import count_verdict
from gateway.api.exchange import Exchange, TryNext, cut_status
from gateway.api.metrics import GatewayMetrics
from gateway.api.recorder import Recorder
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.registry import BackendState
from gateway.upstream.http import Connection
from gateway.upstream.tls import Peer

__all__ = ["recorded", "recorded_on"]


async def recorded(
    recorder: Recorder | None,
    metrics: GatewayMetrics,
    exchange: Exchange,
    backend: BackendState,
    attempt: Callable[[Connection | None], Awaitable[None]],
    connect: Callable[[], Awaitable[Connection]] | None = None,
    withdrawn: Callable[[], str | None] | None = None,
    lapsed: Callable[[], GatewayError | None] = lambda: None,
    moved: Callable[[], str | None] = lambda: None,
) -> str | GatewayError | None:
    """One attempt, bracketed by its provenance records: the dispatch record is
    durable before the attempt sends anything, the completion record follows it.
    A private attempt connects first (`connect`), so that its dispatch record names
    the TLS peer its connection authenticated; a connection that failed (refused, a
    certificate refused) is recorded as the attempt's failure, like one that fails
    later (a backend whose breaker admits no attempt is skipped by the plan, and a
    hosted request its provider's checks refuse by `Proxy._dispatch`, before this: no
    record). An unused connection goes back to its pool.

    A failed attempt's completion says the status its failure answers the client with
    if no other attempt serves (`attempt_status`); so the last record of a request
    always has the status the client got. It is held until the next dispatch record
    or the request's end (`Recorder.settle`): a client that leaves before another
    attempt is dispatched (or a drain deadline that cuts the request then) makes it
    say 499 (503), what the client got. So is the completion of any attempt whose
    answer the app sends after it (an error, a fault's 500, a cut's 503: nothing of
    the response started), until that answer went out (`Proxy.answered`): a client gone
    before then (its receipt still being signed, its charge made) got nothing, 499.

    A reload may land while the attempt connects (or while `HostedRelay.prepare` looked
    up hosts): `withdrawn` is asked again right before the dispatch record, and an
    attempt the policy set active then no longer admits is not made (no record, its
    connection back to its pool): the reason is returned (None: the attempt was made).
    So is a request whose key lapsed meanwhile (`lapsed`, gateway/api/standing.py): the
    error it says is returned. Asked again once the dispatch record is durable and when
    the attempt fails: then the attempt sends nothing (or no other attempt is made) and
    its completion record has that error's status, the status the client gets. So is
    `moved` (gateway/api/proxy.py passes `withdrawn_by_reload`: a reload that narrowed
    the policy, or moved the backend or changed its TLS trust, `Registry.moved`): then
    the attempt fails before it sends, its completion saying why; one whose connection
    had failed says that failure, and carries the reload's reason as what it came to
    (`TryNext.withdrawn`, gateway/api/decided.py)."""
    exchange.upstream_error = None  # this attempt's, not an earlier attempt's
    backend_before = exchange.backend
    connection: Connection | None = None
    failed: TryNext | None = None
    if connect is not None:
        try:
            connection = await connect()
        except TryNext as exc:
            failed = exc

    async def run() -> None:
        nonlocal failed
        stop: GatewayError | None = None
        try:
            stop = lapsed()  # while the dispatch record was made durable: nothing sent
            if stop is not None:
                raise stop
            gone = moved()  # by a reload during the record's write: the old address
            if failed is not None:
                failed.withdrawn = failed.withdrawn or gone
                raise failed
            if gone is not None:
                raise TryNext(gone)
            await attempt(connection)
        except TryNext as exc:  # the next attempt may serve, unless the key lapsed
            stop = lapsed()
            if stop is None:
                raise
            raise stop from exc  # what the client gets, and the completion says
        finally:
            # What is raised from here holds this frame and `recorded`'s (its traceback),
            # and they would hold it: a reference cycle keeping the request's frames (its
            # body among their locals) until the cyclic collector ran.
            stop = failed = None

    try:
        gone: str | GatewayError | None = lapsed()
        if gone is None and withdrawn is not None:
            gone = withdrawn()
        if gone is not None:
            exchange.backend = backend_before  # not this one's: nothing was sent to it
            return gone
        peer = None if connection is None else connection.peer
        await recorded_on(recorder, metrics, exchange, backend, run, peer)
        return None
    finally:
        failed = None  # caught here: its traceback holds this frame (a reference cycle)
        if connection is not None:
            connection.release()


async def recorded_on(
    recorder: Recorder | None,
    metrics: GatewayMetrics,
    exchange: Exchange,
    backend: BackendState,
    attempt: Callable[[], Awaitable[None]],
    peer: Peer | None,
) -> None:
    """Run `attempt` inside its records (`recorded`'s bracket, once it is made): the
    dispatch record naming `peer` made durable first, the completion record written
    however the attempt ends, with the status the client gets."""
    trail = exchange.trail
    if recorder is None or trail is None:
        try:
            await attempt()
        finally:
            if trail is not None:
                count_verdict(metrics, trail)
        return
    assert exchange.decision is not None
    waiting = time.perf_counter()
    await recorder.dispatch(exchange, trail, exchange.decision, backend, peer)
    metrics.observe_dispatch_wait(time.perf_counter() - waiting)
    status, error, held = 0, None, False
    try:
        await attempt()
        status, error = exchange.status, exchange.upstream_error
    except TryNext as exc:  # held until the next dispatch or the request's end
        # As a plain string: a reload's reason is a `str` subclass (decided.Withdrawn),
        # which the record's checks refuse (the completion would not be written).
        status, error, held = attempt_status(exc), str(exc.reason), True
        raise
    except GatewayError as exc:
        status, error = exc.status, exc.code.value
        held = not exchange.response_started  # the app sends it: held until it went out
        raise
    except asyncio.CancelledError:
        if exchange.ended:  # after its answer's end: the client got all of it
            status, error = exchange.status, exchange.upstream_error
        else:
            status, error = cut_status(exchange)
            if status == 503 and exchange.streaming:  # its error event goes out after
                trail.cut_after()
        held = not exchange.response_started  # a cut's 503 goes out after
        raise
    except Exception:
        # A fault of the gateway's own: the client gets 500 internal_error (the app's
        # last resort), so the record says that, not the status 0 no client gets.
        status, error = ErrorCode.internal_error.status, ErrorCode.internal_error.value
        held = not exchange.response_started
        raise
    finally:
        count_verdict(metrics, trail)  # as the record says it
        recorder.complete(exchange, trail, status=status, error=error, held=held)
