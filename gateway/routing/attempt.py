"""One backend's try at a request (`Attempt`): what the relay tells routing mid-attempt,
and the breaker verdict it hands back. The plan (gateway/routing/router.py) yields them
and ends each with `Plan.report`."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.routing.breaker import Pass
from gateway.routing.registry import Route
from gateway.routing.scorers.prefill import prefill_tokens

__all__ = ["Attempt"]


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
