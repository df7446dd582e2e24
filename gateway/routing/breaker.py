"""A circuit breaker per backend: passive health from real requests, with half-open probes.

States and moves (the clock is injected; nothing here does I/O):

- **closed**: requests flow. `failure_threshold` consecutive failures (connect errors,
  5xx, timeouts before the first byte, answers broken off; the relay reports them
  through its `Attempt`, gateway/routing/attempt.py) open it, and so does the scraper
  when the backend's `/health` probes mark it down (`probe_failed`: several failures in
  a row, never for the last backend up; gateway/routing/health.py). With several
  tenants, a run of failures that all came from one tenant's requests (answers, not
  connections: what that tenant's input could cause) does not open it: that tenant's
  own breaker opens instead (gateway/routing/tenant_breakers.py). A run opens it once
  it holds failures of two tenants, or one no tenant caused (connect, TLS).
- **open**: no requests for the cooldown: `cooldown_s`, doubled on every reopening in a
  row, at most `max_cooldown_s`.
- **half-open**: once the cooldown is over, exactly one probe is let through: either a
  real request (`begin` answers `Pass.probe` to one caller) or the scraper's next
  `/health` probe. Success closes the breaker; failure reopens it. A real probe that
  ends with no verdict (the client left) hands the probe to the next caller. With
  several tenants, the failure of a probe that one tenant's input may have caused
  hands the probe on too (that tenant's own breaker counts it): one tenant timing a
  failing request to each cooldown's end would otherwise keep the backend open for
  everyone. A second tenant's failed probe, or one no tenant caused, reopens it.

Every opening and every probe granted starts a new epoch; `begin`'s caller reads
`epoch` and hands it back with the outcome, so a request that began before the last
change (say, while closed, and fails only once a probe is out) neither reopens the
breaker nor ends another request's probe.

A backend marked down by its probes is (re)opened for `cooldown_s` without growing it:
that cost no client anything, and a server still loading its model should be tried again
soon. The cooldown grows only when client requests fail, and resets after a request
succeeds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gateway.config.schema import BreakerSettings

__all__ = ["Breaker", "BreakerState", "Pass"]


class BreakerState(enum.Enum):
    closed = "closed"
    open = "open"
    half_open = "half_open"


class Pass(enum.Enum):
    """What `Breaker.begin` grants a request."""

    normal = "normal"
    probe = "probe"  # the one request of a half-open breaker: its outcome decides


# The members as module constants, read on every request's path: `BreakerState.closed`
# is a look-up through the enum's metaclass (a Python-level `__getattr__` on its class,
# no specialized load), some 700 instructions against a global's few dozen.
_CLOSED, _OPEN, _HALF_OPEN = BreakerState.closed, BreakerState.open, BreakerState.half_open
_NORMAL, _PROBE = Pass.normal, Pass.probe


@dataclass(slots=True)
class Breaker:
    settings: BreakerSettings
    state: BreakerState = BreakerState.closed
    failures: int = 0  # consecutive failures while closed
    trips: int = 0  # openings since the last successful request (sets the cooldown)
    opens: int = 0  # openings ever (a counter for /metrics)
    open_until: float = 0.0
    probing: bool = False  # a half-open probe request is in flight
    last_error: str | None = None
    epoch: int = 0  # bumped at each opening and each probe granted
    # The one tenant whose requests made every failure of the current run, or None once
    # a second tenant's failed, or one no tenant caused (only read while `failures`).
    run_tenant: str | None = None
    # The one tenant whose requests failed every probe since the breaker last opened.
    probe_tenant: str | None = None

    def available(self, now: float) -> bool:
        """Whether a request may be routed here now (no state change)."""
        state = self.state
        if state is _CLOSED:
            return True
        if state is _OPEN:
            return now >= self.open_until
        return not self.probing

    def begin(self, now: float) -> Pass | None:
        """Admit one request: `Pass.normal`, `Pass.probe` (the half-open trial), or None."""
        state = self.state
        if state is _CLOSED:
            return _NORMAL
        if state is _OPEN and now < self.open_until:
            return None
        if self.probing:
            return None
        self.state = _HALF_OPEN
        self.probing = True
        self.epoch += 1
        return _PROBE

    def succeeded(self) -> None:
        """A request got a real answer (headers with a status below 500)."""
        if self.state is _OPEN:
            return  # began before the breaker opened: says nothing about now
        self.state = _CLOSED
        self.failures = 0
        self.trips = 0
        self.probing = False
        self.probe_tenant = None
        self.last_error = None

    def failed(
        self,
        now: float,
        reason: str,
        epoch: int | None = None,
        *,
        at_once: bool = False,
        tenant: str | None = None,
    ) -> None:
        """A request failed (connect, 5xx, timeout, broken off). `epoch`: the breaker's epoch
        when the request began; an outcome from an earlier epoch is only noted. `at_once`:
        a failure no retry mends (a certificate refused): open without counting to the
        threshold. `tenant`: whose request it was, when its input may have caused the
        failure and tenants are told apart; a run of one tenant's failures alone counts
        but does not open the breaker; nor does a run of one tenant's failed half-open
        probes (each hands the probe on)."""
        self.last_error = reason
        if epoch is not None and epoch != self.epoch:
            return
        if self.state is _HALF_OPEN:
            if tenant is not None and self.probe_tenant in (None, tenant):
                self.probe_tenant = tenant  # its input may be the cause: the next probes
                self.probing = False
                return
            self._open(now, grow=True)
        elif self.state is _CLOSED:
            self.failures += 1
            if self.failures == 1 or tenant != self.run_tenant:
                self.run_tenant = tenant if self.failures == 1 else None
            one_tenant = self.run_tenant is not None
            if at_once or (self.failures >= self.settings.failure_threshold and not one_tenant):
                self._open(now, grow=True)

    def abandoned(self, epoch: int | None = None) -> None:
        """The probe request ended with no verdict: let the next request probe (unless a
        newer probe is already out)."""
        if epoch is None or epoch == self.epoch:
            self.probing = False

    def probe_ok(self, now: float) -> None:
        """The scraper's `/health` answered 200: the half-open probe when one is due."""
        if self.state is _OPEN and now >= self.open_until:
            self.state = _CLOSED
            self.failures = 0
            self.last_error = None

    def probe_failed(self, now: float, reason: str) -> None:
        """The scraper's `/health` probes marked the backend down: open (or keep open) at
        the base cooldown."""
        self.last_error = reason
        if self.state is _OPEN and now < self.open_until:
            return
        self._open(now, grow=False)

    def cooldown(self) -> float:
        settings = self.settings
        steps = max(0, self.trips - 1)
        return float(min(settings.max_cooldown_s, settings.cooldown_s * 2.0 ** min(steps, 32)))

    def _open(self, now: float, *, grow: bool) -> None:
        if grow or self.trips == 0:
            self.trips += 1
        self.state = _OPEN
        self.failures = 0
        self.probing = False
        self.probe_tenant = None
        self.opens += 1
        self.epoch += 1
        cooldown = self.cooldown() if grow else self.settings.cooldown_s
        self.open_until = now + cooldown
