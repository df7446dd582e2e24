"""The request path after authentication: body, trust policy, plan, dispatch.

The body is parsed once (for `model` and `stream`). The tenant's trust policy decides
which backends may see the request; that eligible set is a filter, never a score: the
plan below orders only backends in it, retries and fallback stay inside it, and when
nothing compliant can serve, the client gets an error naming the policy rule. Private
backends come first (least loaded first); hosted ones only as the policy's fallback
mode allows: `when_private_unavailable` after every private attempt failed or none was
available, `when_private_saturated` also first when every private backend's queue is
over the policy's threshold. When every private backend is saturated and the policy
allows no such fallback, the request waits in the pool's bounded queue
(gateway/routing/saturation.py). Failover to the next private backend is bounded by
`routing.failover`: attempts, and a deadline from arrival to the first byte.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.api.body import parse_body
from gateway.api.exchange import Exchange, TryNext, watch_disconnect
from gateway.api.hosted_relay import HostedRelay
from gateway.api.labels import UNKNOWN, InvalidLabel, excerpt, label_refused, read_label
from gateway.api.metrics import GatewayMetrics
from gateway.api.passthrough import PrivateRelay
from gateway.api.recorder import Recorder, Trail
from gateway.api.refusal import Refused
from gateway.asgi import Receive, Scope, Send
from gateway.config.schema import Routing
from gateway.errors import ErrorCode, GatewayError
from gateway.policy import Decision, UnknownDataClass
from gateway.provenance import Salts
from gateway.routing.picker import Picker, prefix_span
from gateway.routing.registry import BackendState, Registry, Route
from gateway.routing.saturation import SaturationQueue
from gateway.routing.scraper import MetricsScraper
from gateway.routing.trust import TrustPolicies
from gateway.state import SharedState
from gateway.tenants import TenantEntry
from gateway.upstream.http import DEFAULT_MAX_BODY

__all__ = ["Proxy"]

_MAX_ATTEMPTS = 3  # hosted tier (private: routing.failover.max_attempts)


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
        routing: Routing,
        state: SharedState,
        max_response_bytes: int = DEFAULT_MAX_BODY,
        response_timeout_s: float | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.recorder = recorder  # None: no provenance log configured
        self._registry = registry
        self._metrics = metrics
        self._trust = trust
        self._scraper = scraper
        self._private = PrivateRelay(registry, metrics, state)
        self._picker = Picker(routing, scraper.load)
        self._affinity_bytes = routing.affinity_prefix_bytes
        self._failover = routing.failover
        # One wait queue per public model name, and the queues each backend's completions
        # let go (a backend may serve several pools).
        self.queues: dict[str, SaturationQueue] = {}
        self._queues_of: dict[str, list[SaturationQueue]] = {}
        for name, served_by in registry.routes.items():
            settings = self._picker.pool(name).queue
            private = [r.backend.id for r in served_by if r.backend.pool is not None]
            if settings.size and private:
                queue = self.queues[name] = SaturationQueue(name, settings)
                for backend_id in private:
                    self._queues_of.setdefault(backend_id, []).append(queue)
        self._hosted = HostedRelay(
            metrics,
            environ,
            hosted_timeout_s,
            registry.backends.values(),
            state=state,
            max_response_bytes=max_response_bytes,
            response_timeout_s=response_timeout_s,
        )

    async def forward(
        self,
        exchange: Exchange,
        tenant: TenantEntry,
        scope: Scope,
        body: bytes,
        upstream_path: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        doc = parse_body(body)
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
        routes = self._registry.routes.get(model) if tenant.may_use(model) else None
        if routes is None:
            raise GatewayError(
                ErrorCode.model_not_found,
                f"The model `{excerpt(model)}` does not exist or you do not have access to it.",
                param="model",
            )
        if self.recorder is not None:
            exchange.trail = self.recorder.start(body)
        elif tenant.limits.tokens_per_minute is not None:
            # only to read the usage back
            exchange.trail = Trail(Salts.generate(), "", prompt_bytes=len(body))
        try:
            decision = self._decide(exchange, tenant, model, scope)
        except Refused as refused:
            await self._refused(exchange, refused)
            raise
        exchange.decision = decision
        private = [r for r in routes if r.backend.id in decision.private]
        prefix, shared = None, 0
        if len(private) > 1 and self._picker.pool(model).strategy == "score":
            prefix, shared = prefix_span(doc, self._affinity_bytes) or (None, 0)
        private = self._picker.order(model, private, prefix)
        exchange.prefix, exchange.prefix_bytes = prefix, shared
        by_id = {r.backend.id: r for r in routes}
        hosted = [by_id[b] for b in decision.hosted if b in by_id]
        watcher = watch_disconnect(receive, exchange)
        try:
            await self._dispatch(
                exchange, decision, private, hosted, doc, body, upstream_path, send
            )
        except Refused as refused:  # nothing was dispatched (`_dispatch` says so)
            await self._refused(exchange, refused)
            raise
        except asyncio.CancelledError:
            current = asyncio.current_task()
            # Ours (the client left) and nobody else's (e.g. shutdown): absorb it.
            if not exchange.client_gone or current is None or current.uncancel() > 0:
                raise
            exchange.status = 499  # client closed the request (nginx's convention)
        finally:
            watcher.cancel()

    def _decide(
        self, exchange: Exchange, tenant: TenantEntry, model: str, scope: Scope
    ) -> Decision:
        policy = self._trust.current  # one read: this request sees one policy set
        exchange.policy = f"{policy.id}@{policy.version}"
        exchange.policy_digest = policy.digest
        exchange.data_class = UNKNOWN  # until the label proves to be a declared class
        invalid: InvalidLabel | None = None
        try:
            label = read_label(scope, policy.data_class_header.encode())
        except InvalidLabel as exc:
            # Empty, blank or disagreeing copies: the engine refuses an empty label with
            # its decision (or denies a tenant without a policy), so the refusal record
            # has a trace; the client is told what was wrong with the header.
            invalid, label = exc, ""
        try:
            decision = policy.decide(tenant.id, model, label)
        except UnknownDataClass as exc:
            error = label_refused(policy, tenant.id, invalid or exc)
            raise Refused(
                error.code, error.message, exc.decision, exc.rule, param=error.param
            ) from exc
        if invalid is not None and decision.refusal is None:  # "" names no class: never
            error = label_refused(policy, tenant.id, invalid)
            rule = f"{decision.policy_id}/data_classes"
            raise Refused(error.code, error.message, decision, rule, param=error.param)
        exchange.data_class = decision.data_class
        exchange.data_class_defaulted = decision.default_rule is not None
        if decision.refusal is not None:
            refusal = decision.refusal
            raise Refused(
                ErrorCode.policy_denied, refusal.message, decision, refusal.rule, param="model"
            )
        return decision

    async def _dispatch(
        self,
        exchange: Exchange,
        decision: Decision,
        private: list[Route],
        hosted: list[Route],
        doc: dict[str, Any],
        body: bytes,
        upstream_path: bytes,
        send: Send,
    ) -> None:
        model = doc["model"]
        deadline = exchange.started_at + self._failover.deadline_s
        up = [r for r in private if not self._registry.is_down(r.backend)]
        failures = _Failures([_why_down(r.backend) for r in private if r not in up])
        fallback_allowed = decision.fallback != "never" and bool(hosted)
        saturated = (
            decision.fallback == "when_private_saturated"
            and bool(up)
            and self._all_saturated(up, decision.saturation_threshold)
        )
        if saturated and fallback_allowed:
            exchange.fallback = "private_saturated"
            if await self._try_hosted(exchange, hosted, doc, send, failures):
                return
            exchange.fallback = None
        elif up and not (fallback_allowed and decision.fallback == "when_private_saturated"):
            up = await self._queue_if_saturated(model, up, exchange.prefix)
        for route in up[: self._failover.max_attempts]:
            if time.perf_counter() >= deadline:
                failures.reasons.append("failover deadline passed")
                break
            # The part of the prompt the backend's prefix cache should hold is no prefill.
            holds = self._picker.holds(exchange.prefix, route.backend.id)
            exchange.cached_bytes = exchange.prefix_bytes if holds else 0
            # In flight from now: with no await since the saturation check, a burst
            # cannot all see the backend idle while their dispatch records are written.
            self._private.enter(route.backend)
            try:
                await self._recorded(
                    exchange,
                    route.backend,
                    lambda route=route: self._private.attempt(  # type: ignore[misc]
                        exchange, route, model, doc, body, upstream_path, send, deadline
                    ),
                )
                self._picker.served(exchange.prefix, route.backend.id)
                return
            except TryNext as exc:
                failures.attempt_failed(exc)
            finally:
                self._private.leave(route.backend)
                for queue in self._queues_of.get(route.backend.id, ()):
                    queue.release()
        if fallback_allowed and not saturated:
            exchange.fallback = "private_unavailable"
            if await self._try_hosted(exchange, hosted, doc, send, failures):
                return
        if failures.last is not None:
            # Dispatched and failed: what the last attempt came to (its completion record
            # says the same), never a refusal.
            raise _attempt_error(failures.last, model, failures.reasons)
        raise _nothing_served(decision, model, private, hosted, failures.reasons)

    async def _try_hosted(
        self,
        exchange: Exchange,
        hosted: list[Route],
        doc: dict[str, Any],
        send: Send,
        failures: _Failures,
    ) -> bool:
        for route in hosted[:_MAX_ATTEMPTS]:
            try:
                await self._recorded(
                    exchange,
                    route.backend,
                    lambda route=route: self._hosted.attempt(  # type: ignore[misc]
                        exchange, route, doc, send
                    ),
                )
                return True
            except TryNext as exc:
                failures.attempt_failed(exc)
        return False

    async def _recorded(
        self,
        exchange: Exchange,
        backend: BackendState,
        attempt: Callable[[], Awaitable[None]],
    ) -> None:
        """One attempt, bracketed by its provenance records: the dispatch record is
        durable before the attempt sends anything, the completion record follows it.

        A failed attempt's completion says the status its failure answers the client with
        if no other attempt serves (`_attempt_status`); so the last record of a request
        always has the status the client got."""
        recorder, trail = self.recorder, exchange.trail
        exchange.upstream_error = None  # this attempt's, not an earlier attempt's
        if recorder is None or trail is None:
            await attempt()
            return
        assert exchange.decision is not None
        waiting = time.perf_counter()
        await recorder.dispatch(exchange, trail, exchange.decision, backend)
        self._metrics.dispatch_wait.observe(time.perf_counter() - waiting)
        status, error = 0, None
        try:
            await attempt()
            status, error = exchange.status, exchange.upstream_error
        except TryNext as exc:
            status, error = _attempt_status(exc), exc.reason
            raise
        except GatewayError as exc:
            status, error = exc.status, exc.code.value
            raise
        except asyncio.CancelledError:
            status, error = (
                (499, "client closed the request")
                if exchange.client_gone
                else (503, "cut: the gateway shut down before the answer ended")
            )
            raise
        finally:
            recorder.complete(exchange, trail, status=status, error=error)

    async def _refused(self, exchange: Exchange, refused: Refused) -> None:
        """The refusal record (nothing was dispatched): the decision's rule and trace, and
        the request commitment; the client gets the receipt of it."""
        if self.recorder is not None and exchange.trail is not None:
            await self.recorder.refuse(exchange, exchange.trail, refused)

    def score(self, model: str, backend: BackendState) -> float:
        """The picker's score of `backend` for `model` now (for `/admin/status`)."""
        return self._picker.score(self._picker.pool(model), backend, False)

    async def _queue_if_saturated(
        self, model: str, up: list[Route], prefix: bytes | None
    ) -> list[Route]:
        """Wait in the pool's queue while every private backend is saturated (and behind
        earlier waiters, first come first served); then the backends in their order now."""
        queue = self.queues.get(model)
        if queue is None:
            return up
        threshold = queue.settings.threshold
        if not queue.waiting and not self._all_saturated(up, threshold):
            return up
        await queue.wait(lambda: self._all_saturated(up, threshold), self._scraper.interval_s)
        return self._picker.order(model, up, prefix)

    def _all_saturated(self, routes: list[Route], threshold: float | None) -> bool:
        if threshold is None:
            return False
        return all(self._queue_per_slot(r.backend) > threshold for r in routes)

    def _queue_per_slot(self, backend: BackendState) -> float:
        """Waiting requests per concurrency slot: the larger of what the backend's fresh
        /metrics report and what the gateway's own in-flight count (every replica's, with
        shared state) over the configured capacity implies (the fast signal, ahead of the
        next scrape)."""
        capacity = backend.config.capacity.max_concurrency or backend.learned_slots
        load = self._scraper.load(backend.id)
        queued = 0.0
        slots = float(capacity or 0)
        if load is not None and load.waiting is not None:
            queued = load.waiting
            slots = slots or (load.running or 0.0)
        if capacity:
            queued = max(queued, float(backend.global_inflight - capacity))
        return queued / slots if slots else 0.0  # unknown capacity: never "saturated"

    async def close(self) -> None:
        await self._hosted.close()


def _why_down(backend: BackendState) -> str:
    return f"{backend.id}: {backend.health_error or 'failed moments ago'}"


class _Failures:
    """Why the backends of one request did not serve it, and the last attempt's failure
    (None while nothing was dispatched)."""

    __slots__ = ("last", "reasons")

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        self.last: TryNext | None = None

    def attempt_failed(self, exc: TryNext) -> None:
        self.reasons.append(exc.reason)
        self.last = exc


def _attempt_status(exc: TryNext) -> int:
    """The status a failed attempt answers the client with if it is the last one."""
    return exc.error.status if exc.error is not None else ErrorCode.backend_unavailable.status


def _attempt_error(last: TryNext, model: str, failures: list[str]) -> GatewayError:
    """What the client gets when every attempt failed: the last attempt's error (what the
    backend said, translated), or 503 backend_unavailable naming every failure. Its
    status is `_attempt_status(last)`, which the last completion record holds."""
    if last.error is not None:
        return last.error
    return GatewayError(
        ErrorCode.backend_unavailable,
        f"no compliant backend could take the request for model `{model}` ({'; '.join(failures)})",
    )


def _nothing_served(
    decision: Decision, model: str, private: list[Route], hosted: list[Route], failures: list[str]
) -> Refused:
    """Nothing was dispatched: no backend the policy admits was available, and its
    fallback rule allows no hosted one (or none is configured)."""
    details = "; ".join(failures)
    if not private:
        state = "no eligible private backend"
    else:
        state = f"private pool unavailable: {details}" if details else "private pool unavailable"
    reason = (
        f"{state}, fallback forbidden"
        if decision.fallback == "never"
        else f"{state}, no compliant hosted backend"
    )
    rule = decision.fallback_rule
    return Refused(
        ErrorCode.no_compliant_backend,
        f"policy {rule}: no compliant backend available for model `{model}` ({reason})",
        decision,
        rule,
    )
