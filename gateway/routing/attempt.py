"""One backend's try at a request (`Attempt`): what the relay tells routing mid-attempt,
and the breaker verdict it hands back. The plan (gateway/routing/router.py) yields them
and ends each with `Plan.report`."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from gateway.logs import get_logger
from gateway.routing.breaker import Pass
from gateway.routing.registry import BackendState, Route
from gateway.routing.scorers.prefill import prefill_tokens

__all__ = ["FALLBACK_STATES", "Attempt", "FallbackBasis", "Outcome"]

_PROBE = Pass.probe  # read per attempt: an enum member's look-up costs ~15x a global's

# What each eligible private backend came to, as a fallback's dispatch record states it:
# (backend id, state), state one of "down" (not tried: down, its breaker closed to it, or
# withdrawn by a policy reload, which a later set admitting it again takes as never tried:
# `Plan.withdrawn`; no record of it), "failed" (tried and failed), "busy" (tried, answered
# busy), "saturated" (up, over the threshold). The plan also knows "refused" (the request's
# media URL), "retired" (nothing sent: its config's pool closed, or a config reload
# moved, re-trusted, removed or redeclared it) and "out of time" (its wait for the first
# byte cut short by the request's failover deadline, which passed first): none opens a
# fallback, so no dispatch record states them.
FallbackBasis = tuple[tuple[str, str], ...]

# The states that let `when_private_unavailable` (and `when_private_saturated`) fall back
# (the plan's rule, gateway/routing/router.py; a reload's too, gateway/api/decided.py).
FALLBACK_STATES = {
    "when_private_unavailable": frozenset({"down", "failed"}),
    "when_private_saturated": frozenset({"down", "failed", "busy"}),
}

# Failure kinds no request's input causes: the backend could not be reached or its
# certificate was refused before a request was read. They count on the backend's breaker
# whichever tenant's request met them (gateway/routing/tenant_breakers.py).
_BACKEND_SIDE = frozenset({"connect", "tls"})
# Failure kinds of the gateway's own making, never the backend's: its connection limit
# (`busy`), its own descriptors or socket memory run out (`exhausted`), a pool closed with
# its config (`retired`: no connection was opened).
_GATEWAY_SIDE = frozenset({"busy", "exhausted", "retired"})


class Outcome(enum.Enum):
    """How an attempt ended, as far as routing cares."""

    served = "served"  # the client got this backend's answer (or its error, relayed)
    failed = "failed"  # failed before the client saw a byte: the next attempt may serve
    ended = "ended"  # ended otherwise (the client left, the gateway shut down, an error)
    # not made after all: nothing sent, no record, not counted among the attempts (a reload
    # withdrew the backend, a hosted one refused before sending): the next one may serve
    skipped = "skipped"


class Attempt:
    """One backend's try at a request. The relay tells routing through it what happened
    mid-attempt; the plan's `report` ends it.

    Breaker rules: an attempt, private or hosted, is `admit`ted by the backend's breaker
    (a half-open breaker admits one probe) and judged at most once: a 5xx at the headers, a failure
    before or during the answer, or how the answer ended (`succeeded`, `failed`). A
    failure that was not the backend's is not charged (`upstream_failed`: `busy`, this
    gateway's own connection limit; `exhausted`, its own descriptors; `retired`, a pool
    its config closed; a timeout that the failover deadline cut short). A verdict from
    before the breaker's last change (its epoch) is only noted; a probe that ends with no
    verdict hands the probe on.

    With `tenant` (breakers tell tenants apart: gateway/routing/tenant_breakers.py) the
    tenant's own breaker on the backend must admit the attempt too, and a failure its
    input may have caused (a 5xx, a timeout, an answer broken off; not `connect` or
    `tls`) is charged to both: the tenant's opens at the threshold, the backend's only
    once the failures in a row came from two tenants. What counts as a hosted provider's
    failure is the hosted relay's to say (gateway/api/hosted_relay.py)."""

    __slots__ = (
        "_clipped",
        "_clock",
        "_epoch",
        "_first_byte",
        "_judged",
        "_prefilling",
        "_probe",
        "_tenant_epoch",
        "_tenant_probe",
        "backend",
        "cached_bytes",
        "closed_to",
        "deadline",
        "leaving",
        "private",
        "route",
        "tenant",
    )

    def __init__(
        self,
        route: Route,
        cached_bytes: int,
        deadline: float,
        clock: Callable[[], float],
        private: bool,
        tenant: str | None = None,
    ) -> None:
        self.route = route
        self.backend = route.backend
        self.cached_bytes = cached_bytes  # of the prompt, what its prefix cache should hold
        self.deadline = deadline
        self.private = private
        self.tenant = tenant  # a configured tenant id, or None: one breaker for all
        self.closed_to = "circuit breaker open"  # why `admit` said no
        self._clock = clock
        self._epoch = 0
        self._probe = False
        self._tenant_epoch = 0  # of the tenant's breaker (0: none yet, as a new one's)
        self._tenant_probe = False
        self._judged = False  # whether the breaker heard how this attempt went
        self._clipped = False  # its first-byte wait was cut short by the deadline
        self._first_byte = False  # that wait is over: its first byte (or headers) came
        self._prefilling = 0  # prompt tokens it added to its backend's prefill count
        # Takes it off its backend's in-flight count (the router's, set as it is yielded).
        self.leaving: Callable[[BackendState], None] | None = None

    def leave(self) -> None:
        """Its backend is done with it: off the backend's in-flight count (once; the
        plan's `report` does it too). Called as soon as a whole answer was read, before
        its client is sent it: a client that reads slowly holds its request until it
        has taken the answer (its completion record waits for that, gateway/api/
        exchange.py), and kept in flight meanwhile, its slow reads made the backend look
        saturated to every tenant's requests (queued, failed over to a hosted provider
        or refused) though it had finished."""
        leaving, self.leaving = self.leaving, None
        if leaving is not None:
            leaving(self.backend)

    def admit(self) -> bool:
        """Whether the backend's breaker (and the tenant's own on it) lets this attempt
        send; `closed_to` says why not."""
        now = self._clock()
        breaker = self.backend.breaker
        if not breaker.available(now):
            return False
        own = None if self.tenant is None else self.backend.tenant_breakers.get(self.tenant)
        if own is not None:
            own_grant = own.begin(now)
            if own_grant is None:
                self.closed_to = "circuit breaker open for this tenant's requests"
                return False
            self._tenant_probe = own_grant is _PROBE
            self._tenant_epoch = own.epoch
        grant = breaker.begin(now)  # available just now, nothing awaited since
        if grant is None:  # pragma: no cover - `available` said it would admit
            if self._tenant_probe and self.tenant is not None:
                self.backend.tenant_breakers.abandoned(self.tenant, self._tenant_epoch)
            self._tenant_probe = False
            return False
        self._probe = grant is _PROBE
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

    def cut_short(self, kind: str) -> bool:
        """Whether a failure of `kind` is a timeout the request's failover deadline caused
        (its first-byte wait cut short, and still waiting): no verdict on the backend, and
        not unavailable. A timeout once the first byte came (a whole answer that stopped
        mid-body, `read_timeout_s`) is another timer's: the backend's failure."""
        return kind == "timeout" and self._clipped and not self._first_byte

    def sending(self, body_bytes: int) -> None:
        """The request (`body_bytes` long) goes out: count its prefill at the backend."""
        self._prefilling = prefill_tokens(body_bytes, self.cached_bytes)
        self.backend.prefilling += self._prefilling

    def first_byte(self) -> None:
        """The backend's first byte (or a whole answer): its prefill is over."""
        self._first_byte = True
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
            if self.tenant is not None:
                self.backend.tenant_breakers.succeeded(self.tenant)

    def failed(self, reason: str, *, at_once: bool = False, backend_side: bool = False) -> None:
        """The verdict: the backend failed (a 5xx, broke off, hung; `at_once`: its
        certificate was refused, which opens the breaker without waiting for more;
        `backend_side`: no request's input causes this failure, as connecting)."""
        if self._judged:
            return
        self._judged = True
        backend, now = self.backend, self._clock()
        tenant = None if backend_side else self.tenant
        if tenant is not None:
            settings = backend.breaker.settings
            if backend.tenant_breakers.failed(tenant, settings, now, reason, self._tenant_epoch):
                get_logger("owngate.routing").warning(
                    "backend circuit breaker opened for one tenant",
                    backend=backend.id,
                    tenant=tenant,  # a configured tenant id
                    reason=reason,  # the gateway's own words, never the backend's body
                )
        backend.breaker.failed(now, reason, self._epoch, at_once=at_once, tenant=tenant)

    def upstream_failed(self, kind: str, detail: str) -> None:
        """The exchange with the backend failed (`UpstreamError`'s kind and detail):
        the verdict, unless the failure was not the backend's."""
        if kind in _GATEWAY_SIDE or self.cut_short(kind):
            return
        self.failed(f"{kind}: {detail}", at_once=kind == "tls", backend_side=kind in _BACKEND_SIDE)

    def end(self) -> None:
        """The attempt is over: a probe with no verdict hands the probe on; what is left
        of its prefill count goes."""
        if not self._judged:
            if self._probe:
                self.backend.breaker.abandoned(self._epoch)
            if self._tenant_probe and self.tenant is not None:
                self.backend.tenant_breakers.abandoned(self.tenant, self._tenant_epoch)
        self.first_byte()
