"""Each tenant's share of one backend's connections in use: a private pool's, or a hosted
backend's calls.

A backend's pool (gateway/upstream/http.py) has `limits.max_connections_per_backend`
connections, shared by every tenant. A stream holds its connection for as long as the
backend decodes (and, for a client that reads nothing, until the write timeout cuts it
off), so without a share one tenant's unread streams could hold every connection and
leave the others `busy`. With more than one tenant configured, a tenant may hold at most
`limits.tenant_share_of_backend` of a pool's connections (at least one) at once; past it
its next attempt is `UpstreamError("busy")` for that backend at once (it fails over,
queues or is refused as a full pool would be), for that tenant only.

A connection counts for the tenant whose request took it (`_Connection.holder`) from
the moment it is handed out (a slot is reserved before the wait for it, so concurrent
attempts cannot overrun the share) until it goes back idle or is dropped: the pool's
`_put_idle` and `_forget`, which every path that ends a connection's use goes through
(an answer read to its end, an error, a cancelled request, a client gone, a stale
connection replaced in `request()`, an unused `Connection.release()`).

Under `owngate serve --workers N` every worker has a pool of its own: a share per pool
gave one tenant N shares of the backend, one through each worker (measured: a pool of 4
through 2 workers, one tenant's 16 unread streams held 4 of the backend's, where one
process lets it hold 2). Worker i of N now holds the tenant to its part of the share
(`share_cap`'s `part`/`parts`: the share divided by N, rounded down, one more for the
first `share % N`), so the parts sum to the share; a share smaller than N has no such
split and is refused (`share_unsplittable`), at start and at a reload.

A hosted backend's calls go through LiteLLM's aiohttp connector, whose pool (500
connections per host, 1,000 in all) every tenant shares, and which holds a stream's
connection as long as the provider streams or its client reads slowly: one tenant's
unread hosted streams could hold all of it, and another tenant's call then waited for a
connection until it timed out. Each hosted backend has a `TenantShare` of its calls
(`BackendState.calls`) with the same cap as a private pool's (the share of
`limits.max_connections_per_backend`, split over workers alike): a call counts for its
tenant (`hold`) from when the hosted relay admits it, before anything is sent, until its
answer was relayed or abandoned (`release`, in a `finally`: answered, failed, cancelled,
client gone); past the share, the tenant's next hosted attempt on the backend is `busy`
at once (gateway/api/hosted_relay.py). The share is of the calls LiteLLM's connector can
make at once (`hosted_calls`: `max_connections_per_backend`, or fewer where its limits,
500 per host and 1,000 in all unless its environment says otherwise, are lower): before,
it was of `max_connections_per_backend` alone, and with 1,024 configured (a large
private fleet) one tenant's 512 unread streams held all 500 connections to the provider.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from gateway.upstream.failures import UpstreamError

if TYPE_CHECKING:
    from gateway.config.schema import GatewaySettings
    from gateway.upstream.connection import _Connection

__all__ = [
    "TenantShare",
    "config_share_unsplittable",
    "hosted_calls",
    "share_cap",
    "share_unsplittable",
]

_PAST_SHARE = "this tenant holds its share of the backend's connections"


def share_cap(
    max_connections: int, share: float, tenants: int, part: int = 1, parts: int = 1
) -> int | None:
    """How many of a pool's `max_connections` one tenant may hold (None: no bound, with
    one tenant or a share of the whole pool), in worker `part` (1..`parts`) of `serve
    --workers N`: its part of the share, the parts summing to the share (0 for a share
    smaller than `parts`, which `share_unsplittable` refuses)."""
    if tenants <= 1 or share >= 1.0:
        return None
    whole = max(1, int(max_connections * share))
    if parts <= 1:
        return whole
    part = min(max(part, 1), parts)
    return whole // parts + (1 if part <= whole % parts else 0)


# LiteLLM's connector limits (1.108.7: `litellm.constants`), read from its environment as
# it reads them (unset, blank or not a number: the default; 0 or less: no limit).
_LITELLM_LIMITS = (("AIOHTTP_CONNECTOR_LIMIT_PER_HOST", 500), ("AIOHTTP_CONNECTOR_LIMIT", 1000))


def hosted_calls(max_connections: int, environ: Mapping[str, str] = os.environ) -> int:
    """How many of a hosted backend's calls can hold a connection at once: the configured
    `max_connections`, or fewer where LiteLLM's connector allows fewer (the share of a
    tenant is of these, so that the others always have some)."""
    calls = max_connections
    for name, default in _LITELLM_LIMITS:
        raw = environ.get(name, "").strip()
        try:
            limit = int(raw) if raw else default
        except ValueError:
            limit = default
        if limit > 0:
            calls = min(calls, limit)
    return calls


def share_unsplittable(max_connections: int, share: float, tenants: int, parts: int) -> str | None:
    """Why one tenant's share of a pool cannot be split over `parts` workers (some would
    give it no connection), or None."""
    whole = share_cap(max_connections, share, tenants)
    if whole is None or parts <= 1 or whole >= parts:
        return None
    return (
        f"limits.tenant_share_of_backend: a tenant's share of a backend's "
        f"{max_connections} connections (max_connections_per_backend) is {whole}, less than "
        f"the {parts} workers of serve --workers {parts}: each worker holds a tenant to its "
        "own part of the share (share / workers, summing to the share); raise "
        "max_connections_per_backend or tenant_share_of_backend (1 turns the share off), "
        "or run fewer workers"
    )


def config_share_unsplittable(config: GatewaySettings, workers: int) -> list[str]:
    """`share_unsplittable` for `config`'s pools and tenants (those whose `models` list
    is not empty, as `Registry.build` counts them), as a list of problems."""
    tenants = sum(bool(t.models) for t in config.tenants)
    limits = config.limits
    problem = share_unsplittable(
        limits.max_connections_per_backend, limits.tenant_share_of_backend, tenants, workers
    )
    return [] if problem is None else [problem]


class TenantShare:
    """The connections of one pool each tenant holds, bounded by `cap` (None: unbounded)."""

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self._held: dict[str, int] = {}

    def held(self, tenant: str) -> int:
        """How many of the pool's connections `tenant`'s requests hold now."""
        return self._held.get(tenant, 0)

    async def take(
        self, tenant: str | None, get: Callable[[], Awaitable[_Connection]]
    ) -> _Connection:
        """A connection from `get()` held for `tenant`, or `UpstreamError("busy")` with
        nothing taken when the tenant holds its share already (None: not counted)."""
        if tenant is None or self.cap is None:
            return await get()
        held = self._held.get(tenant, 0)
        if held >= self.cap:
            raise UpstreamError("busy", _PAST_SHARE)
        self._held[tenant] = held + 1
        try:
            conn = await get()
        except BaseException:  # no connection (failed, busy, cancelled): the share back
            self._free(tenant)
            raise
        conn.holder = tenant
        return conn

    def hold(self, tenant: str) -> bool:
        """Count one more hosted call of `tenant`'s, or False with nothing counted when
        it holds its share already. Counted whatever the cap (a reload may set one while
        calls run): each True is matched by one `release(tenant)`."""
        held = self._held.get(tenant, 0)
        if self.cap is not None and held >= self.cap:
            return False
        self._held[tenant] = held + 1
        return True

    def release(self, tenant: str) -> None:
        """A call `hold` counted for `tenant` is over."""
        self._free(tenant)

    def give_back(self, conn: _Connection) -> None:
        """`conn` went back idle or was dropped: its tenant no longer holds it."""
        tenant, conn.holder = conn.holder, None
        if tenant is not None:
            self._free(tenant)

    def _free(self, tenant: str) -> None:
        left = self._held[tenant] - 1
        if left:
            self._held[tenant] = left
        else:
            del self._held[tenant]
