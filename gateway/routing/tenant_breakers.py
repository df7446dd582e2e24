"""A backend's circuit breakers scoped to one tenant each: one tenant whose requests make
a backend fail takes that backend out for itself, not for every tenant.

A tenant's input can make a backend fail: a prompt whose prefill outlasts
`first_byte_timeout_s`, an input that makes the server answer 500 or break off. Counted
on the backend's one breaker (gateway/routing/breaker.py), `failure_threshold` such
requests in a row took the backend out for every tenant: their requests went to the next
backend, to a hosted fallback their policy allows only when private backends are
unavailable, or nowhere (503). So, when the gateway serves several tenants, such a
failure is charged twice (gateway/routing/attempt.py):

- to the tenant's own breaker here (created at its first failure, the same settings and
  state machine as the backend's): `failure_threshold` in a row open it, and that
  tenant's requests skip the backend (fail over, fall back as its own policy allows)
  while it cools down; a half-open probe of its own requests closes it;
- to the backend's breaker, which counts the run but opens only once it holds the
  failures of two tenants, or one that no tenant's input causes (connect refused, TLS,
  a failed `/health` probe): those still open it for everyone.

A request of the tenant that succeeds closes its breaker, and the entry goes. The map is
bounded: tenant ids come from the configuration, and at most `MAX_TENANTS` are kept per
backend. Each new entry first drops those untouched for `IDLE_S`; when the map is still
full, the longest untouched goes.
Nothing here does I/O; the clock is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.config.schema import BreakerSettings
from gateway.routing.breaker import Breaker, BreakerState

__all__ = ["IDLE_S", "MAX_TENANTS", "TenantBreakers"]

MAX_TENANTS = 1024  # tenants with a breaker of their own, per backend
IDLE_S = 3600.0  # an entry no failure touched for this long is dropped first


@dataclass(slots=True)
class _Entry:
    breaker: Breaker
    touched: float  # the clock at its last failure


@dataclass(slots=True)
class TenantBreakers:
    """The tenant-scoped breakers of one backend (kept on its `BackendState`)."""

    _entries: dict[str, _Entry] = field(default_factory=dict)
    opens: int = 0  # openings ever, all tenants (a counter for /metrics)

    def get(self, tenant: str) -> Breaker | None:
        """The tenant's breaker, None while it has no failure on record (closed)."""
        entry = self._entries.get(tenant)
        return None if entry is None else entry.breaker

    def available(self, tenant: str, now: float) -> bool:
        """Whether the tenant's breaker lets a request through now (no state change)."""
        entry = self._entries.get(tenant)
        return entry is None or entry.breaker.available(now)

    def failed(
        self, tenant: str, settings: BreakerSettings, now: float, reason: str, epoch: int
    ) -> bool:
        """A request of `tenant` failed in a way its input may have caused; `epoch`: its
        breaker's when the request began (0 when it had none). Whether this opened it."""
        entry = self._entries.pop(tenant, None)  # re-inserted last: the newest touched
        if entry is None:
            self._make_room(now)
            entry = _Entry(Breaker(settings), now)
        entry.breaker.settings = settings  # routing.breaker may have changed on a reload
        entry.touched = now
        self._entries[tenant] = entry
        before = entry.breaker.opens
        entry.breaker.failed(now, reason, epoch)
        opened = entry.breaker.opens != before
        self.opens += opened
        return opened

    def succeeded(self, tenant: str) -> None:
        """A request of `tenant` got a real answer: its breaker closes (unless the request
        began before it opened), and a closed one is forgotten."""
        entry = self._entries.get(tenant)
        if entry is None:
            return
        entry.breaker.succeeded()
        if entry.breaker.state is BreakerState.closed:
            del self._entries[tenant]

    def abandoned(self, tenant: str, epoch: int) -> None:
        """The tenant's probe ended with no verdict: the next of its requests probes."""
        entry = self._entries.get(tenant)
        if entry is not None:
            entry.breaker.abandoned(epoch)

    def items(self) -> list[tuple[str, Breaker]]:
        """(tenant, breaker) of every tenant with failures on record, by tenant id."""
        return sorted((tenant, entry.breaker) for tenant, entry in self._entries.items())

    def open_count(self, now: float) -> int:
        """Tenants this backend admits no request of now."""
        return sum(not entry.breaker.available(now) for entry in self._entries.values())

    def _make_room(self, now: float) -> None:
        entries = self._entries
        for tenant in [t for t, e in entries.items() if now - e.touched >= IDLE_S]:
            del entries[tenant]
        while len(entries) >= MAX_TENANTS:
            del entries[next(iter(entries))]  # the longest untouched
