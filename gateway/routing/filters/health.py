"""The health filter: a backend that is down is skipped, and the reason noted.

A backend is down when its circuit breaker does not admit a request now (open and
cooling down, or half-open with its one probe out: gateway/routing/breaker.py; config
`routing.breaker` and a backend's `breaker`) or when its `/health` probes marked it
down until `unhealthy_until` (gateway/routing/health.py and scraper.py; config
`health` and `scrape`). For one tenant it is also down while its breaker scoped to that
tenant is open (what that tenant's own requests made the backend fail:
gateway/routing/tenant_breakers.py); other tenants' requests still go to it. Inputs: the
`BackendState`, the registry's clock and, when breakers tell tenants apart, the
request's tenant. The reason, `<id>: <last error>` (or "failed moments ago"), goes into
the error a client gets when nothing could serve the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.routing.registry import BackendState, Route

__all__ = ["available_routes", "unavailable", "why_down"]


def unavailable(backend: BackendState, now: float) -> bool:
    """Marked down by its probes, or its breaker admits no request now."""
    return backend.unhealthy_until > now or not backend.breaker.available(now)


def why_down(backend: BackendState) -> str:
    return f"{backend.id}: {backend.health_error or 'failed moments ago'}"


def available_routes(
    routes: Sequence[Route], now: float, reasons: list[str], tenant: str | None = None
) -> list[Route]:
    """The routes whose backend is up (for `tenant`'s requests, when given), in their
    order; each skipped one's reason is appended to `reasons`."""
    up: list[Route] = []
    for route in routes:
        backend = route.backend
        if unavailable(backend, now):
            reasons.append(why_down(backend))
        elif tenant is not None and not backend.tenant_breakers.available(tenant, now):
            reasons.append(_why_down_for(backend, tenant))
        else:
            up.append(route)
    return up


def _why_down_for(backend: BackendState, tenant: str) -> str:
    breaker = backend.tenant_breakers.get(tenant)
    error = (breaker and breaker.last_error) or "failed moments ago"
    return f"{backend.id}: circuit breaker open for this tenant's requests ({error})"
