"""The request path after authentication: parse → decide → plan → (record, relay, report).

The body is parsed once (for `model` and `stream`). The tenant's trust policy decides
which backends may see the request (`Decision`, gateway/policy). The router plans the
attempts (gateway/routing/router.py: the trust and health filters, the picker's order,
the fallback mode, the saturation wait, the failover bounds), and the dispatch is

    for attempt in plan: record, relay, report

each attempt bracketed by its provenance records (gateway/api/recorded_attempt.py: the
dispatch record is durable before the attempt sends, the completion record follows with
the status the client gets), relayed to a private backend (gateway/api/passthrough.py)
or a hosted one (gateway/api/hosted_relay.py), and reported back to the plan. An attempt that sends
nothing has no records: one a reload withdrew (gateway/api/decided.py, asked as its turn
comes and again right before its dispatch record), one whose request's key lapsed
meanwhile (revoked, removed or given to another tenant, or its model taken from the tenant:
gateway/api/standing.py; the request stops there, a refusal when nothing was dispatched),
and a hosted one whose request its provider's checks refuse or for which LiteLLM does not
load (`HostedRelay.prepare`, before the dispatch record; the next backend may serve).
When no attempt served, the client gets the last dispatched attempt's error (also when the
log then refused the next attempt's dispatch record: its completion is the request's last
record); with nothing dispatched, 503 when LiteLLM did not load (`hosted_unavailable`), the
first hosted refusal's 400 (`not_sent`), or a refusal naming the policy rule and why each
backend was skipped, each with its refusal record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from gateway.api.attempt_errors import attempt_error, stopped
from gateway.api.attempt_media import Narrowed, media_narrowed
from gateway.api.body import BodyScan, parse_body
from gateway.api.control_fields import refuse_control_fields
from gateway.api.decided import Decided, Withdrawn, withdrawn_by_reload
from gateway.api.exchange import Exchange, TryNext, client_left, cut_status, watch_disconnect
from gateway.api.hosted_relay import HostedRelay, NotSent
from gateway.api.labels import UNKNOWN
from gateway.api.listing import decide_listed
from gateway.api.metrics import GatewayMetrics
from gateway.api.passthrough import PrivateRelay
from gateway.api.private_media import MediaRefs, MediaWalk
from gateway.api.recorded_attempt import recorded
from gateway.api.recorder import Recorder
from gateway.api.refusal import (
    HOSTED_CHECKS_RULE,
    MEDIA_URLS_RULE,
    Refused,
    diagnosis,
    hosted_unavailable,
    not_sent,
    nothing_served,
)
from gateway.api.reservation import reserve_tokens
from gateway.api.router_fields import RouterFields, private_refusal
from gateway.api.server_fields import refuse_unreadable_encoding
from gateway.api.standing import Standing
from gateway.api.trail import Trail
from gateway.api.usage_bound import counted_media
from gateway.asgi import Receive, Scope, Send
from gateway.config.schema import MAX_MEDIA_WALK_VALUES, RoutingSettings
from gateway.errors import ErrorCode, GatewayError
from gateway.policy_set import STALE_POLICIES, TrustPolicies
from gateway.provenance import LogEntry, Salts
from gateway.routing.registry import Registry
from gateway.routing.router import Attempt, Outcome, Router
from gateway.routing.scraper import MetricsScraper
from gateway.state import SharedState
from gateway.upstream.hosted import Prepared
from gateway.upstream.http import DEFAULT_MAX_BODY, Connection

__all__ = ["Proxy"]

_ENDED, _SERVED = Outcome.ended, Outcome.served  # per attempt: a global, not an enum look-up

_RETRY_SOON = ((b"retry-after", b"1"),)


class Proxy:
    def __init__(
        self,
        registry: Registry,
        metrics: GatewayMetrics,
        trust: TrustPolicies,
        scraper: MetricsScraper,
        *,
        environ: Mapping[str, str],
        hosted_timeout_s: float,
        routing: RoutingSettings,
        state: SharedState,
        max_response_bytes: int = DEFAULT_MAX_BODY,
        max_media_walk_values: int = MAX_MEDIA_WALK_VALUES,
        response_timeout_s: float | None = None,
        stream_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.recorder = recorder  # None: no provenance log configured
        self._registry = registry
        self._metrics = metrics
        self._trust = trust
        self._walk_most = max_media_walk_values  # `limits.max_media_walk_values`
        self._private = PrivateRelay(metrics)
        self.router = Router(registry, routing, scraper.load, scraper.interval_s, state)
        self._hosted = HostedRelay(
            metrics,
            environ,
            hosted_timeout_s,
            registry.backends.values(),
            max_response_bytes=max_response_bytes,
            response_timeout_s=response_timeout_s,
            stream_timeout_s=stream_timeout_s,
            read_timeout_s=read_timeout_s,
        )

    async def forward(
        self,
        exchange: Exchange,
        standing: Standing,
        scope: Scope,
        body: bytes,
        scan: BodyScan | None,
        upstream_path: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        tenant = standing.tenant
        doc = parse_body(body, scan)  # scan: `scan_body(body)`
        refuse_control_fields(doc, body)  # a router's and an inference server's own fields
        media_count = counted_media(doc, body, walk := MediaWalk(self._walk_most))  # once
        if exchange.endpoint == "embeddings":
            refuse_unreadable_encoding(doc)  # vLLM's binary answer: no client reads it here
        media = MediaRefs.of(doc, body, walk=walk)  # URLs a backend fetches (count's walk)
        model = doc.get("model")
        if not isinstance(model, str) or not model:
            raise GatewayError(
                ErrorCode.missing_model,
                "you must provide a model parameter (a string naming the model)",
                param="model",
            )
        exchange.stream = doc.get("stream") is True
        # Only a configured name is logged or recorded: the client's string may be anything.
        exchange.model = model if model in self._registry.routes else UNKNOWN
        if self._trust.stale:  # a worker whose siblings may enforce newer policies
            raise GatewayError(ErrorCode.not_ready, STALE_POLICIES, headers=_RETRY_SOON)
        if (admission := exchange.admission) is not None:  # before a backend sees the prompt
            embed = exchange.endpoint == "embeddings"
            await reserve_tokens(admission, tenant, doc, len(body), media_count, embeddings=embed)
        if self.recorder is not None:
            exchange.trail = self.recorder.start(body)
        elif tenant.limits.tokens_per_minute is not None:
            # only to read the usage back
            exchange.trail = Trail(Salts.generate(), "", prompt_bytes=len(body))
        if exchange.trail is not None:
            exchange.trail.ask, exchange.trail.media = doc, media_count  # its charge's bound
        try:  # one read of the active set: the decision is its
            policy = self._trust.current
            # A model the tenant's `/v1/models` does not list: the 404 of one that does
            # not exist, a refusal recorded with the rule that refused it (listing.py).
            registry, metrics = self._registry, self._metrics
            decided = decide_listed(policy, registry, metrics, exchange, tenant, model, scope)
        except Refused as refused:
            await self._refused(exchange, refused)
            raise
        exchange.decision = decided.decision
        unwatch = watch_disconnect(receive, exchange)
        try:
            await self._dispatch(
                exchange, standing, decided, model, doc, body, media, upstream_path, send
            )
        except Refused as refused:  # nothing was dispatched (`_dispatch` says so)
            await self._refused(exchange, refused)
            raise
        except asyncio.CancelledError:
            current = asyncio.current_task()
            # Ours (the client left) and nobody else's (e.g. shutdown): absorb it.
            if not exchange.client_gone or current is None or current.uncancel() > 0:
                raise
            # Client closed the request (499, nginx's convention), or a forced shutdown
            # dropped its connection (503).
            exchange.status = cut_status(exchange)[0]
        finally:
            unwatch()

    def answered(self, exchange: Exchange, status: int | None) -> None:
        """The request is over (the app's answer went out, or did not): write the
        completion still held, if any (the last attempt failed before the client saw a
        byte, or the request was cut or left between attempts), with the status the client
        got: `status`, that of the answer the app sent (the error, a fault's 500, a cut's
        503; None: none, the request was cancelled: 503, 499), and 499 whenever the client
        was gone by the time it went out (its receipt being signed, its charge made), as
        `send_whole` tells it: nothing reached it."""
        recorder, trail = self.recorder, exchange.trail
        if recorder is None or trail is None or trail.held is None:
            return
        if client_left(exchange):  # 499, or 503 when the gateway dropped the connection
            status = exchange.status = cut_status(exchange)[0]
        elif status is None:
            status = cut_status(exchange)[0]
        recorder.settle(exchange, trail, status)

    async def _dispatch(
        self,
        exchange: Exchange,
        standing: Standing,
        decided: Decided,
        model: str,
        doc: dict[str, Any],
        body: bytes,
        media: MediaRefs | None,
        upstream_path: bytes,
        send: Send,
    ) -> None:
        decision = decided.decision
        plan = await self.router.plan(model, decision, doc, exchange.started_at)
        private, hosted, registry = self._private, self._hosted, self._registry
        last: TryNext | None = None
        traced = exchange.span
        if traced is not None:
            traced.requested(doc)
        # The first refusal before sending (a hosted provider's checks, a private backend's
        # media URLs), and the rule its refusal record names.
        unsent: GatewayError | None = None
        unsent_rule = HOSTED_CHECKS_RULE
        routers = RouterFields(doc, exchange.endpoint)  # a `kind: openai` backend's hosted rule
        stop: GatewayError | None = None
        gone: str | GatewayError | None = None
        try:
            for attempt in plan:  # in flight from here: reported however it ends
                outcome, reason, busy, span = _ENDED, "", False, None
                came_to: str | None = None  # a private one neither down nor failed
                try:
                    stop = standing.lapsed(model)  # the key or the tenant, as it stands now
                    if stop is not None:
                        outcome, reason = Outcome.skipped, f"{attempt.backend.id}: not made"
                        raise stopped(stop, decision, last, model, exchange.request_id.decode())
                    withdrawn = withdrawn_by_reload(self._trust, registry, decided, attempt, plan)
                    if withdrawn is not None:  # not dispatched: no record, the next one may serve
                        outcome, reason, came_to = Outcome.skipped, withdrawn, withdrawn.came_to
                        continue
                    prepared = None
                    # before its dispatch record: its media URLs, a router's hosted fields
                    found = private_refusal(media, routers, registry, attempt)
                    if found is not None:
                        # not sent: no record, the next one may serve
                        outcome, reason = Outcome.skipped, f"{attempt.backend.id}: {found[2]}"
                        came_to = "refused"  # the request's URL or field: no fallback
                        if unsent is None:
                            unsent, unsent_rule = found[0], found[1]
                        continue
                    if not attempt.private:  # checked before its dispatch record, sent nothing
                        try:
                            prepared = await hosted.prepare(exchange, attempt, doc)
                        except NotSent as exc:
                            outcome, reason = Outcome.skipped, exc.reason
                            unsent = unsent or exc.error
                            plan.hosted_down |= exc.hosted_down  # LiteLLM did not load: no hosted
                            continue
                    if traced is not None:  # tracing on: the attempt's span (gateway/tracing)
                        span = traced.attempt(attempt, exchange, plan.fallback)
                    exchange.fallback, exchange.fallback_basis = plan.fallback, plan.basis
                    exchange.provider_model = None if prepared is None else prepared.provider_model
                    # Asked again once the dispatch record is durable and on a retried
                    # connection: a reload that landed meanwhile (a policy that no longer
                    # admits the backend, a config that moved it) stops the send; narrowing
                    # takes effect for every send after it (`Registry.moved` is part of it).
                    moved = partial(
                        withdrawn_by_reload, self._trust, registry, decided, attempt, plan
                    )
                    if attempt.private and media is not None:  # and a narrowed `media_urls`
                        moved = partial(media_narrowed, moved, media, registry, attempt)
                    relay: Callable[[Connection | None], Awaitable[None]]
                    connect: Callable[[], Awaitable[Connection]] | None = None
                    if attempt.private:  # connected first: the dispatch record names its peer
                        connect = partial(private.connect, exchange, attempt)
                        relay = partial(
                            private.attempt,
                            exchange,
                            attempt,
                            model,
                            doc,
                            body,
                            upstream_path,
                            send,
                        )
                        relay = partial(relay, moved=moved)  # asked again on a retried connection
                    else:
                        assert prepared is not None
                        relay = partial(_hosted, hosted, exchange, attempt, prepared, send)
                    logged = None if exchange.trail is None else exchange.trail.dispatch
                    before = exchange.backend, exchange.upstream_error  # the access line's
                    try:
                        gone = await recorded(
                            self.recorder,
                            self._metrics,
                            exchange,
                            attempt.backend,
                            relay,
                            connect,
                            moved,
                            partial(standing.lapsed, model),
                            moved,
                        )
                    except GatewayError as exc:
                        if last is None or not _not_logged(exc, exchange, logged):
                            raise
                        # The log refused its dispatch record (nothing sent) after the last
                        # attempt's completion went in: the client gets that attempt's
                        # error, the status the log holds for the request.
                        outcome, reason = Outcome.skipped, f"{attempt.backend.id}: not logged"
                        exchange.backend, exchange.upstream_error = before
                        raise attempt_error(last, model, exchange.request_id.decode()) from None
                    if isinstance(gone, GatewayError):  # the key lapsed meanwhile: not made
                        outcome, reason = Outcome.skipped, f"{attempt.backend.id}: not made"
                        raise stopped(gone, decision, last, model, exchange.request_id.decode())
                    if gone is not None:  # withdrawn by a reload while it connected or was checked
                        outcome, reason, came_to = Outcome.skipped, gone, _came_to(gone)
                        if isinstance(gone, Narrowed) and unsent is None:  # as refused above
                            unsent, unsent_rule = gone.error, MEDIA_URLS_RULE
                        continue
                    outcome = _SERVED
                    if exchange.fallback is not None:
                        self._metrics.fallback(attempt.backend.id, exchange.fallback)
                    return
                except TryNext as exc:
                    last, outcome, reason, busy = exc, Outcome.failed, exc.reason, exc.busy
                    # Withdrawn by a reload once its record was made, or its pool closed:
                    # nothing sent, not tried (its URL: refused; its config changed: retired)
                    why = exc.withdrawn or exc.reason
                    came_to = _came_to(why, "retired" if exc.retired else exc.came_to)
                finally:
                    plan.report(attempt, outcome, reason, busy=busy, came_to=came_to)
                    if span is not None:
                        span.end(outcome, reason, exchange)
            exchange.fallback = plan.fallback
            exchange.unserved = diagnosis(plan.reasons)  # the operator's: its access line
            if last is not None:
                # Dispatched and failed: what the last attempt came to (its completion record
                # says the same), never a refusal.
                raise attempt_error(last, model, exchange.request_id.decode())
            if plan.hosted_down:  # nothing dispatched, LiteLLM did not load: 503, a refusal record
                raise hosted_unavailable(decision, model, exchange.request_id.decode())
            if unsent is not None:  # nothing dispatched: the client's 400, a refusal record
                raise not_sent(unsent, decision, unsent_rule)
            raise nothing_served(decision, model, exchange.request_id.decode())
        finally:
            # The error raised from here holds this frame (its traceback): none of
            # them may stay among its locals, or the frames up to the request's (its
            # body among their locals) outlive it in a reference cycle.
            last = unsent = stop = gone = found = None

    async def _refused(self, exchange: Exchange, refused: Refused) -> None:
        """The refusal record (nothing was dispatched): the decision's rule and trace, and
        the request commitment; the client gets the receipt of it."""
        self._metrics.refusal(refused.rule, refused.code.value)
        if exchange.span is not None:
            exchange.span.refused(refused)
        trail = exchange.trail
        if self.recorder is not None and trail is not None:
            try:
                await self.recorder.refuse(exchange, trail, refused)
            finally:  # also when a shutdown cut it once the record was in the log
                if trail.refusal is not None:
                    exchange.refused = refused.detached()  # not the one raised through here

    async def close(self) -> None:
        await self._hosted.close()


async def _hosted(
    hosted: HostedRelay,
    exchange: Exchange,
    attempt: Attempt,
    prepared: Prepared,
    send: Send,
    _connection: Connection | None,
) -> None:
    """A hosted attempt (LiteLLM opens its own connections)."""
    await hosted.attempt(exchange, attempt, prepared, send)


def _came_to(reason: str, otherwise: str | None = None) -> str | None:
    """What a private attempt a reload withdrew came to for the fallback (`Withdrawn`)."""
    return reason.came_to if isinstance(reason, Withdrawn) else otherwise


def _not_logged(error: GatewayError, exchange: Exchange, logged: LogEntry | None) -> bool:
    """Whether `error` is the log's refusal of an attempt's dispatch record: 503
    `provenance_unavailable` with the request's last dispatch (`logged`) still the one
    before it (none was written for this attempt, and nothing was sent)."""
    trail = exchange.trail
    return (
        error.code is ErrorCode.provenance_unavailable
        and trail is not None
        and trail.dispatch is logged
    )
