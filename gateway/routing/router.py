"""The plan of one request: which backends to try, in which order, and what came of each.

`Router.plan(model, decision, request)` runs the filters and the picker:

1. trust (gateway/routing/filters/trust.py): only the decision's private backends, and
   its hosted fallbacks in its order;
2. the picker (gateway/routing/picker.py) orders the private ones (strategy, scorers);
3. health (gateway/routing/filters/health.py) skips the ones that are down, noting why
   (with several tenants configured, also those whose breaker scoped to the request's
   tenant is open: gateway/routing/tenant_breakers.py);
4. the fallback mode of the decision: `never`; `when_private_unavailable`: hosted only
   once every eligible private backend is unavailable for this request (see below);
   `when_private_saturated`: hosted first too when every private backend up is over the
   policy's `saturation_threshold` (waiting requests per slot, gateway/routing/load.py).
5. When every private backend is over the pool's `routing.*.queue.threshold` and the
   policy allows no saturated fallback, the request waits in the pool's bounded queue
   (gateway/routing/saturation.py) before its first attempt, then the backends are
   ordered again; a freed slot goes to the tenants with waiters in turn (round-robin,
   first come first served within a tenant).

The `Plan` then yields `Attempt`s in order: hosted first when saturated (at most 3);
private, at most `routing.failover.max_attempts` and none once
`routing.failover.deadline_s` from arrival has passed; hosted last when the fallback mode
allows (at most 3) and every eligible private backend was unavailable for this request:
down before it was tried (health or breaker at planning or when its turn came, or
withdrawn by a policy reload: `Plan.withdrawn`, never tried for a later set admitting it
again), or tried and failed (refused, broken or timed-out connection, a 5xx, a 401, 403
or 404). One never tried (the attempts or the deadline ran out first) or
"busy" (a 429, the gateway's own connection limit; accepted by `when_private_saturated`)
was not shown unavailable: no hosted fallback, the client gets the last attempt's error.
Hosted providers have breakers too (the backend's and, with several tenants, each
tenant's). Every attempt is admitted by its breakers as it is yielded, before its
dispatch record: one that admits no request when its turn comes (opened since planning,
or half-open with its probe held by another request) is skipped, its reason noted. A
skipped attempt, and one reported `Outcome.skipped` (withdrawn by a reload, a hosted one
that sent nothing), has no dispatch record and does not count among the attempts
(counted in `report`); a skipped private backend is "down" for the fallback, one skipped
for a media URL in the request "refused" (no fallback past it: the client's input).
`Plan.basis` says, for a fallback's dispatch record, each private backend's state.

Each attempt counts as in flight on its backend from when it is yielded, with no await since
the saturation check (a burst cannot all see a backend idle while their dispatch records are
written), and ends with one `Plan.report(attempt, outcome)` (attempt.py): the backend's
in-flight (`Attempt.leave`) and prefill counts go, the breaker hears of a probe that ended
with no verdict, the prefix's backend is remembered when it served, one waiter of each pool
the backend serves goes. The relay tells the attempt what it learns (`admit`, `first_byte`,
`answered`, `succeeded`, `failed`, `upstream_failed`): routing keeps the breaker's epochs
and the counters. `Plan.reasons` says why backends were skipped or failed (the error).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gateway.config.schema import RoutingSettings
from gateway.routing.attempt import FALLBACK_STATES, Attempt, FallbackBasis, Outcome
from gateway.routing.filters.health import available_routes
from gateway.routing.filters.trust import eligible_hosted, eligible_private
from gateway.routing.load import queue_per_slot
from gateway.routing.picker import LoadOf, Picker
from gateway.routing.registry import BackendState, Registry, Route
from gateway.routing.saturation import SaturationQueue
from gateway.routing.scorers.affinity import prefix_span
from gateway.state import SharedState

if TYPE_CHECKING:
    from gateway.policy import Decision

__all__ = ["HOSTED_MAX_ATTEMPTS", "Attempt", "FallbackBasis", "Outcome", "Plan", "Router"]

# Read per attempt: an enum member's look-up through its metaclass costs ~15x a global's.
_SERVED, _FAILED, _SKIPPED = Outcome.served, Outcome.failed, Outcome.skipped

HOSTED_MAX_ATTEMPTS = 3  # per hosted pass (private: routing.failover.max_attempts)


class Router:
    """Plans the requests of one configuration (rebuilt with it on a reload)."""

    def __init__(
        self,
        registry: Registry,
        routing: RoutingSettings,
        load_of: LoadOf,
        poll_s: float,
        state: SharedState,
    ) -> None:
        """`load_of`: a backend's fresh scraped load (gateway/routing/scraper.py), `poll_s`
        how often a waiter re-checks saturation (the scrape interval); `state` keeps the
        in-flight counts every replica sees (this replica's are `BackendState.inflight`,
        which /metrics reads at scrape time as `owngate_backend_inflight`)."""
        self._registry = registry
        self._load_of = load_of
        self._poll_s = poll_s
        self._state = state  # no I/O here: the state syncs in the background
        self.picker = Picker(routing, load_of)
        self._affinity_bytes = routing.affinity_prefix_bytes
        failover = routing.failover  # plain copies: a pydantic model's reads cost ~15x
        self._deadline_s, self._max_attempts = failover.deadline_s, failover.max_attempts
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
        if len(private) > 1 and picker.strategy(model) == "score":
            # The tenant's own prefixes: another tenant's prompts never steer this route.
            found = prefix_span(request, self._affinity_bytes, decision.tenant)
            prefix, prefix_bytes = found or (None, 0)
        private = picker.order(model, private, prefix)
        hosted = eligible_hosted(by_id, decision)
        reasons: list[str] = []
        # Breakers tell tenants apart (gateway/routing/tenant_breakers.py) when several
        # are configured: one tenant's failing requests take a backend out for itself.
        tenant = decision.tenant if self._registry.per_tenant else None
        up = available_routes(private, self._registry.clock(), reasons, tenant)
        mode = decision.fallback
        fallback_allowed = mode != "never" and bool(hosted)
        saturated = (
            mode == "when_private_saturated"
            and bool(up)
            and self._all_saturated(up, decision.saturation_threshold)
        )
        hosted_first = saturated and fallback_allowed
        if not hosted_first and up and not (fallback_allowed and mode == "when_private_saturated"):
            up = await self._queue_if_saturated(model, up, prefix, tenant)
        return Plan(
            self,
            private,
            up,
            hosted,
            reasons,
            started_at + self._deadline_s,
            prefix,
            prefix_bytes,
            hosted_first=hosted_first,
            hosted_last=fallback_allowed and not saturated,
            mode=mode,
            tenant=tenant,
        )

    def score(self, model: str, backend: BackendState) -> float:
        """The picker's score of `backend` for `model` now (for `/admin/status`)."""
        picker = self.picker
        return picker.score(picker.pool(model), backend, False)

    def queue_per_slot(self, backend: BackendState) -> float:
        """Waiting requests per slot of `backend` now (the saturation check's measure)."""
        return queue_per_slot(backend, self._load_of(backend.id))

    async def _queue_if_saturated(
        self, model: str, up: list[Route], prefix: bytes | None, tenant: str | None
    ) -> list[Route]:
        """Wait in the pool's queue while every private backend is saturated (behind
        `tenant`'s earlier waiters and, per freed slot, one waiter of each other tenant
        waiting: turns across tenants; `tenant`'s waiters within its part of the queue,
        when several tenants are configured); then the backends in their order now."""
        queue = self.queues.get(model)
        if queue is None:
            return up
        threshold = queue.threshold
        if not queue.waiting and not self._all_saturated(up, threshold):
            return up
        await queue.wait(lambda: self._all_saturated(up, threshold), self._poll_s, tenant)
        return self.picker.order(model, up, prefix)

    def _all_saturated(self, routes: list[Route], threshold: float | None) -> bool:
        if threshold is None:
            return False
        load_of = self._load_of
        return all(queue_per_slot(r.backend, load_of(r.backend.id)) > threshold for r in routes)

    def _enter(self, backend: BackendState) -> None:
        backend.inflight += 1
        self._state.backend_started(backend.id)

    def _leave(self, backend: BackendState) -> None:
        backend.inflight -= 1
        self._state.backend_finished(backend.id)
        for queue in self._queues_of.get(backend.id, ()):
            queue.release()


class Plan:
    """The attempts of one request, in order (iterate it once), and why backends did not
    serve it. `private` (ordered, down ones included) and `hosted` are the eligible
    backends; `fallback` says why a hosted backend is tried (`private_saturated`,
    `private_unavailable`; None for a private attempt or once the saturated fallback
    failed), current at each attempt and once the plan is spent; `basis` is the state of
    each eligible private backend that allowed it; `withheld` why a hosted fallback the
    policy allows was not used (a private backend was not shown unavailable)."""

    __slots__ = (
        "_made",
        "_mode",
        "_router",
        "_states",
        "_up",
        "basis",
        "deadline",
        "fallback",
        "hosted",
        "hosted_down",
        "hosted_first",
        "hosted_last",
        "prefix",
        "prefix_bytes",
        "private",
        "reasons",
        "tenant",
        "withdrawn",
        "withheld",
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
        mode: str,
        tenant: str | None = None,
    ) -> None:
        self._router = router
        self._made = 0  # attempts of the current pass reported made (not `skipped`)
        self.tenant = tenant  # whose breakers its attempts answer to, if per tenant
        self._mode = mode
        up_ids = {route.backend.id for route in up}
        # Per eligible private backend: what it came to so far (absent: not tried yet).
        self._states: dict[str, str] = {
            route.backend.id: "down" for route in private if route.backend.id not in up_ids
        }
        self.basis: FallbackBasis = ()
        # The private backends a policy reload withdrew: "down" for the set that withdrew
        # them, never tried for a later one admitting them again (gateway/api/decided.py)
        self.withdrawn: set[str] = set()
        self.withheld: str | None = None
        self.private, self.hosted, self.reasons = private, hosted, reasons
        self._up = up  # the private ones up, in the order to try them
        self.deadline = deadline  # `time.perf_counter()` time: first byte by then
        self.fallback: str | None = None
        self.prefix = prefix  # the prompt prefix's key (affinity), if any
        self.prefix_bytes = prefix_bytes  # how much of the request body that key covers
        self.hosted_first = hosted_first  # hosted before private (saturated)
        self.hosted_last = hosted_last  # hosted once private failed or was down
        # Set by the caller when no hosted backend can be called now (LiteLLM failed to
        # load): the hosted attempts left are skipped, not dispatched.
        self.hosted_down = False

    def __iter__(self) -> Iterator[Attempt]:
        if self.hosted_first:
            self.fallback = "private_saturated"
            self.basis = self._basis("saturated")
            yield from self._hosted()
            self.fallback, self.basis = None, ()
        yield from self._private()
        if self.hosted_last:
            withheld = self._not_unavailable()
            if withheld:
                self.withheld = f"hosted fallback withheld: {withheld}"
                self.reasons.append(self.withheld)
                return
            self.fallback = "private_unavailable"
            self.basis = self._basis("failed")  # each one is down, failed or busy by now
            yield from self._hosted()

    def _not_unavailable(self) -> str:
        """The eligible private backends not shown unavailable to this request, and why;
        "" when every one was (the fallback mode then allows hosted)."""
        allowed = FALLBACK_STATES.get(self._mode, frozenset())
        states = self._states
        left = [
            f"{r.backend.id} {states.get(r.backend.id, 'not tried')}"
            for r in self.private
            if states.get(r.backend.id) not in allowed
        ]
        return ", ".join(left)

    def _basis(self, default: str) -> FallbackBasis:
        """Each eligible private backend's state, in the plan's order (`default` for one
        not yet tried)."""
        states = self._states
        return tuple((r.backend.id, states.get(r.backend.id, default)) for r in self.private)

    def _private(self) -> Iterator[Attempt]:
        # As `_hosted`: a backend whose breakers admit no request when its turn comes is
        # skipped, its reason noted and its state "down", and not counted.
        picker, self._made = self._router.picker, 0
        for route in self._up:
            if self._made >= self._router._max_attempts:
                return
            if time.perf_counter() >= self.deadline:
                self.reasons.append("failover deadline passed")
                return
            # The part of the prompt the backend's prefix cache should hold is no prefill.
            holds = picker.holds(self.prefix, route.backend.id)
            attempt = self._admitted(route, self.prefix_bytes if holds else 0, private=True)
            if attempt is not None:
                yield attempt

    def _hosted(self) -> Iterator[Attempt]:
        # Admitted when the hosted pass comes (not at planning); a skipped one not counted.
        self._made = 0
        for route in self.hosted:
            if self._made >= HOSTED_MAX_ATTEMPTS:
                return
            attempt = self._admitted(route)
            if attempt is not None:
                yield attempt

    def _admitted(
        self, route: Route, cached_bytes: int = 0, *, private: bool = False
    ) -> Attempt | None:
        """An attempt on `route` its breakers admitted, or None (the reason noted). Admitted
        as it is yielded (nothing awaited since the check), so a dispatch record is
        written only for an attempt that holds its pass (a half-open breaker's probe). A
        hosted route goes through the health filter here (its reason names the
        provider's last error); a private one went through it at planning."""
        router = self._router
        clock, reasons, tenant = router._registry.clock, self.reasons, self.tenant
        if not private and self.hosted_down:
            reasons.append(f"{route.backend.id}: hosted provider unavailable (not tried)")
            return None
        if not private and not available_routes((route,), clock(), reasons, tenant):
            return None
        attempt = Attempt(route, cached_bytes, self.deadline, clock, private, tenant)
        if not attempt.admit():
            reasons.append(f"{route.backend.id}: {attempt.closed_to}")
            if private:
                self._states[route.backend.id] = "down"
            return None
        router._enter(route.backend)  # in flight from now: see the module docstring
        attempt.leaving = router._leave  # until `report`, or the answer's end (`leave`)
        return attempt

    def report(
        self,
        attempt: Attempt,
        outcome: Outcome,
        reason: str = "",
        *,
        busy: bool = False,
        came_to: str | None = None,
    ) -> None:
        """`attempt` is over (call it once, however it ended; `reason`: why it failed,
        `busy`: up but no room, a 429 or the gateway's own connection limit; `came_to`: a
        private one's state when not the outcome's: "refused", skipped for a media URL in
        the request, "retired", its pool closed or its backend changed by a config reload;
        none is unavailable; "withdrawn": by a policy reload, "down" and noted in
        `withdrawn`). Any outcome but `skipped` counts among the pass's attempts."""
        if outcome is not _SKIPPED:
            self._made += 1
        if came_to == "withdrawn" and attempt.private:
            came_to = "down"
            self.withdrawn.add(attempt.backend.id)
        if outcome is _FAILED:
            self.reasons.append(reason)
            if attempt.private:
                self._states[attempt.backend.id] = came_to or ("busy" if busy else "failed")
        elif outcome is _SKIPPED:  # not tried: no record of it, "down" for a fallback
            self.reasons.append(reason)
            if attempt.private:
                self._states[attempt.backend.id] = came_to or "down"
        attempt.end()
        router = self._router
        if outcome is _SERVED and attempt.private:
            router.picker.served(self.prefix, attempt.backend.id)
        attempt.leave()  # unless it left already
