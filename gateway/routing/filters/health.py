"""The health filter: a backend that is down is skipped, and the reason noted.

A backend is down when its circuit breaker does not admit a request now (open and
cooling down, or half-open with its one probe out: gateway/routing/breaker.py; config
`routing.breaker` and a backend's `breaker`) or when its `/health` probes marked it
down until `unhealthy_until` (gateway/routing/health.py and scraper.py; config
`health` and `scrape`). Inputs: the `BackendState` and the registry's clock. The
reason, `<id>: <last error>` (or "failed moments ago"), goes into the error a client
gets when nothing could serve the request.
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


def available_routes(routes: Sequence[Route], now: float, reasons: list[str]) -> list[Route]:
    """The routes whose backend is up, in their order; each skipped one's reason is
    appended to `reasons`."""
    up: list[Route] = []
    for route in routes:
        if unavailable(route.backend, now):
            reasons.append(why_down(route.backend))
        else:
            up.append(route)
    return up
