"""The plan of one request: which backends to try, in which order, and what came of each.

`Router.plan(model, decision, request)` runs the filters and the picker:

1. trust (gateway/routing/filters/trust.py): only the decision's private backends, and
   its hosted fallbacks in its order;
2. the picker (gateway/routing/picker.py) orders the private ones (strategy, scorers);
3. health (gateway/routing/filters/health.py) skips the ones that are down, noting why;
4. the fallback mode of the decision: `never`; `when_private_unavailable`: hosted after
   every private attempt failed or none was up; `when_private_saturated`: hosted first
   too when every private backend up is over the policy's `saturation_threshold`
   (waiting requests per slot, gateway/routing/load.py).
5. When every private backend is over the pool's `routing.*.queue.threshold` and the
   policy allows no saturated fallback, the request waits in the pool's bounded queue
   (gateway/routing/saturation.py) before its first attempt, then the backends are
   ordered again.

The `Plan` then yields `Attempt`s in order: hosted first when saturated (at most 3);
private, at most `routing.failover.max_attempts` and none once
`routing.failover.deadline_s` from arrival has passed; hosted last when the fallback
mode allows (at most 3). Each attempt counts as in flight on its backend from the
moment it is yielded, with no await since the saturation check (so a burst cannot all
see a backend idle while their dispatch records are written), and ends with one
`Plan.report(attempt, outcome)`: it lets the backend's in-flight and prefill counts go,
tells the breaker of a probe that ended with no verdict, remembers the prefix's backend
when the attempt served, and lets one waiter of each pool the backend serves go. What
the relay learns mid-attempt it tells the attempt (`admit`, `first_byte`, `answered`,
`succeeded`, `failed`, `upstream_failed`): routing, not the relay, keeps the breaker's
epochs and the counters. `Plan.reasons` says why backends were skipped or failed, for
the client's error when none served.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gateway.config.schema import RoutingSettings
from gateway.routing.breaker import Pass
from gateway.routing.filters.health import available_routes
from gateway.routing.filters.trust import eligible_hosted, eligible_private
from gateway.routing.load import queue_per_slot
from gateway.routing.picker import LoadOf, Picker
from gateway.routing.registry import BackendState, Registry, Route
from gateway.routing.saturation import SaturationQueue
from gateway.routing.scorers.affinity import prefix_span
from gateway.routing.scorers.prefill import prefill_tokens
from gateway.state import SharedState

if TYPE_CHECKING:
    from gateway.policy import Decision

__all__ = ["HOSTED_MAX_ATTEMPTS", "Attempt", "Outcome", "Plan", "Router"]

HOSTED_MAX_ATTEMPTS = 3  # per hosted pass (private: routing.failover.max_attempts)


class Outcome(enum.Enum):
    """How an attempt ended, as far as routing cares."""

    served = "served"  # the client got this backend's answer (or its error, relayed)
    failed = "failed"  # failed before the client saw a byte: the next attempt may serve
    ended = "ended"  # ended otherwise (the client left, the gateway shut down, an error)


class Router:
    """Plans the requests of one configuration (rebuilt with it on a reload)."""

    def __init__(
        self,
        registry: Registry,
        routing: RoutingSettings,
        load_of: LoadOf,
        poll_s: float,
        state: SharedState,
        on_inflight: Callable[[str, int], None],
    ) -> None:
        """`load_of`: a backend's fresh scraped load (gateway/routing/scraper.py), `poll_s`
        how often a waiter re-checks saturation (the scrape interval); `state` keeps the
        in-flight counts every replica sees, `on_inflight` the in-flight gauge."""
        self._registry = registry
        self._load_of = load_of
        self._poll_s = poll_s
        self._state = state  # no I/O here: the state syncs in the background
        self._on_inflight = on_inflight
        self.picker = Picker(routing, load_of)
        self._affinity_bytes = routing.affinity_prefix_bytes
        self._failover = routing.failover
        # Per public model name: its routes, and those by backend id (the hosted filter).
        self._models = {
            name: (served_by, {r.backend.id: r for r in served_by})
            for name, served_by in registry.routes.items()
        }
        # One wait queue per public model name, and the queues each backend's completions
        # let go (a backend may serve several pools).
        self.queues: dict[str, SaturationQueue] = {}
        self._queues_of: dict[str, list[SaturationQueue]] = {}
        for name, served_by in registry.routes.items():
            settings = self.picker.pool(name).queue
            private = [r.backend.id for r in served_by if r.backend.pool is not None]
            if settings.size and private:
                queue = self.queues[name] = SaturationQueue(name, settings)
                for backend_id in private:
                    self._queues_of.setdefault(backend_id, []).append(queue)

    async def plan(
        self, model: str, decision: Decision, request: dict[str, Any], started_at: float
    ) -> Plan:
        """The plan for `request` (its parsed body) to the configured `model`, which
        `decision` allowed; `started_at` (`time.perf_counter()`) starts the failover
        deadline. Waits in the pool's queue when every private backend is saturated;
        raises `GatewayError` when that queue is full or the wait too long."""
        routes, by_id = self._models[model]
        picker = self.picker
        private = eligible_private(routes, decision)
        prefix, prefix_bytes = None, 0
        if len(private) > 1 and picker.pool(model).strategy == "score":
            prefix, prefix_bytes = prefix_span(request, self._affinity_bytes) or (None, 0)
        private = picker.order(model, private, prefix)
        hosted = eligible_hosted(by_id, decision)
        reasons: list[str] = []
        up = available_routes(private, self._registry.clock(), reasons)
        mode = decision.fallback
        fallback_allowed = mode != "never" and bool(hosted)
        saturated = (
            mode == "when_private_saturated"
            and bool(up)
            and self._all_saturated(up, decision.saturation_threshold)
        )
        hosted_first = saturated and fallback_allowed
        if not hosted_first and up and not (fallback_allowed and mode == "when_private_saturated"):
            up = await self._queue_if_saturated(model, up, prefix)
        return Plan(
            self,
            private,
            up,
            hosted,
            reasons,
            started_at + self._failover.deadline_s,
            prefix,
            prefix_bytes,
            hosted_first=hosted_first,
            hosted_last=fallback_allowed and not saturated,
        )

    def score(self, model: str, backend: BackendState) -> float:
        """The picker's score of `backend` for `model` now (for `/admin/status`)."""
        picker = self.picker
        return picker.score(picker.pool(model), backend, False)

    def queue_per_slot(self, backend: BackendState) -> float:
        """Waiting requests per slot of `backend` now (the saturation check's measure)."""
        return queue_per_slot(backend, self._load_of(backend.id))

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
        await queue.wait(lambda: self._all_saturated(up, threshold), self._poll_s)
        return self.picker.order(model, up, prefix)

    def _all_saturated(self, routes: list[Route], threshold: float | None) -> bool:
        if threshold is None:
            return False
        load_of = self._load_of
        return all(queue_per_slot(r.backend, load_of(r.backend.id)) > threshold for r in routes)

    def _enter(self, backend: BackendState) -> None:
        backend.inflight += 1
        self._state.backend_started(backend.id)
        self._on_inflight(backend.id, backend.inflight)

    def _leave(self, backend: BackendState) -> None:
        backend.inflight -= 1
        self._state.backend_finished(backend.id)
        self._on_inflight(backend.id, backend.inflight)
        for queue in self._queues_of.get(backend.id, ()):
            queue.release()


class Plan:
    """The attempts of one request, in order (iterate it once), and why backends did not
    serve it. `private` and `hosted` are the eligible backends (`private` ordered, down
    ones included); `fallback` says why a hosted backend is tried (`private_saturated`,
    `private_unavailable`; None for a private attempt or once the saturated fallback
    failed) and is current at each attempt and once the plan is spent."""

    __slots__ = (
        "_router",
        "_up",
        "deadline",
        "fallback",
        "hosted",
        "hosted_first",
        "hosted_last",
        "prefix",
        "prefix_bytes",
        "private",
        "reasons",
    )

    def __init__(
        self,
        router: Router,
        private: list[Route],
        up: list[Route],
        hosted: list[Route],
        reasons: list[str],
        deadline: float,
        prefix: bytes | None,
        prefix_bytes: int,
        *,
        hosted_first: bool,
        hosted_last: bool,
    ) -> None:
        self._router = router
        self.private = private
        self._up = up  # the private ones up, in the order to try them
        self.hosted = hosted
        self.reasons = reasons
        self.deadline = deadline  # `time.perf_counter()` time: first byte by then
        self.fallback: str | None = None
        self.prefix = prefix  # the prompt prefix's key (affinity), if any
        self.prefix_bytes = prefix_bytes  # how much of the request body that key covers
        self.hosted_first = hosted_first  # hosted before private (saturated)
        self.hosted_last = hosted_last  # hosted once private failed or was down

    def __iter__(self) -> Iterator[Attempt]:
        if self.hosted_first:
            self.fallback = "private_saturated"
            yield from self._hosted()
            self.fallback = None
        router = self._router
        picker = router.picker
        for route in self._up[: router._failover.max_attempts]:
            if time.perf_counter() >= self.deadline:
                self.reasons.append("failover deadline passed")
                break
            # The part of the prompt the backend's prefix cache should hold is no prefill.
            holds = picker.holds(self.prefix, route.backend.id)
            yield self._attempt(route, self.prefix_bytes if holds else 0, private=True)
        if self.hosted_last:
            self.fallback = "private_unavailable"
            yield from self._hosted()

    def _hosted(self) -> Iterator[Attempt]:
        for route in self.hosted[:HOSTED_MAX_ATTEMPTS]:
            yield self._attempt(route, 0, private=False)

    def _attempt(self, route: Route, cached_bytes: int, *, private: bool) -> Attempt:
        router = self._router
        attempt = Attempt(route, cached_bytes, self.deadline, router._registry.clock, private)
        router._enter(route.backend)  # in flight from now: see the module docstring
        return attempt

    def report(self, attempt: Attempt, outcome: Outcome, reason: str = "") -> None:
        """`attempt` is over (call it once, however it ended; `reason`: why it failed)."""
        if outcome is Outcome.failed:
            self.reasons.append(reason)
        attempt.end()
        router = self._router
        if outcome is Outcome.served and attempt.private:
            router.picker.served(self.prefix, attempt.backend.id)
        router._leave(attempt.backend)


class Attempt:
    """One backend's try at a request. The relay tells routing through it what happened
    mid-attempt; the plan's `report` ends it.

    Breaker rules: a private attempt is `admit`ted by the backend's breaker (a half-open
    breaker admits one probe) and judged at most once: a 5xx at the headers, a failure
    before or during the answer, or how the answer ended (`succeeded`, `failed`). A
    failure that was not the backend's is not charged (`upstream_failed`: `busy`, this
    gateway's own connection limit; a timeout that the failover deadline cut short). A
    verdict from before the breaker's last change (its epoch) is only noted; a probe
    that ends with no verdict hands the probe on."""

    __slots__ = (
        "_clipped",
        "_clock",
        "_epoch",
        "_judged",
        "_prefilling",
        "_probe",
        "backend",
        "cached_bytes",
        "deadline",
        "private",
        "route",
    )

    def __init__(
        self,
        route: Route,
        cached_bytes: int,
        deadline: float,
        clock: Callable[[], float],
        private: bool,
    ) -> None:
        self.route = route
        self.backend = route.backend
        self.cached_bytes = cached_bytes  # of the prompt, what its prefix cache should hold
        self.deadline = deadline
        self.private = private
        self._clock = clock
        self._epoch = 0
        self._probe = False
        self._judged = False  # whether the breaker heard how this attempt went
        self._clipped = False  # its first-byte wait was cut short by the deadline
        self._prefilling = 0  # prompt tokens it added to its backend's prefill count

    def admit(self) -> bool:
        """Whether the backend's breaker lets this attempt send."""
        breaker = self.backend.breaker
        grant = breaker.begin(self._clock())
        if grant is None:
            return False
        self._probe = grant is Pass.probe
        self._epoch = breaker.epoch  # handed back with the verdict
        return True

    def first_byte_wait(self, budget: float) -> float:
        """How long to wait for the first byte: the backend's `budget`, cut to what the
        request's failover deadline leaves (possibly <= 0)."""
        left = self.deadline - time.perf_counter()
        if left < budget:
            self._clipped = True
            return left
        return budget

    def sending(self, body_bytes: int) -> None:
        """The request (`body_bytes` long) goes out: count its prefill at the backend."""
        self._prefilling = prefill_tokens(body_bytes, self.cached_bytes)
        self.backend.prefilling += self._prefilling

    def first_byte(self) -> None:
        """The backend's first byte (or a whole answer): its prefill is over."""
        self.backend.prefilling -= self._prefilling
        self._prefilling = 0

    def answered(self) -> None:
        """The backend answered (headers below 500, a stream chunk): alive, whatever its
        `/health` says (gateway/routing/health.py)."""
        self.backend.answered += 1

    def succeeded(self) -> None:
        """The verdict: a real answer."""
        if not self._judged:
            self._judged = True
            self.backend.breaker.succeeded()

    def failed(self, reason: str, *, at_once: bool = False) -> None:
        """The verdict: the backend failed (a 5xx, broke off, hung; `at_once`: its
        certificate was refused, which opens the breaker without waiting for more)."""
        if not self._judged:
            self._judged = True
            self.backend.breaker.failed(self._clock(), reason, self._epoch, at_once=at_once)

    def upstream_failed(self, kind: str, detail: str) -> None:
        """The exchange with the backend failed (`UpstreamError`'s kind and detail):
        the verdict, unless the failure was not the backend's."""
        if kind == "busy" or (kind == "timeout" and self._clipped):
            return
        self.failed(f"{kind}: {detail}", at_once=kind == "tls")

    def end(self) -> None:
        """The attempt is over: a probe with no verdict hands the probe on; what is left
        of its prefill count goes."""
        if self._probe and not self._judged:
            self.backend.breaker.abandoned(self._epoch)
        self.first_byte()
