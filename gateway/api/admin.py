"""`GET /admin/status`: what routing knows about every backend, for `owngate status`.

Loopback only: the endpoint answers clients connecting from 127.0.0.0/8 or ::1 (on the
gateway's host, or through `kubectl port-forward` / `kubectl exec`) and refuses every
other address with 403, since it names backends and their load. It needs no key, so no
admin credential exists to leak; put nothing that proxies remote clients on the same
host in front of it without filtering `/admin/`.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from gateway.api.asgi import Scope, Send, send_error, send_json
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.breaker import BreakerState
from gateway.routing.registry import BackendState, Registry
from gateway.routing.scraper import MetricsScraper

if TYPE_CHECKING:
    from gateway.api.proxy import Proxy

__all__ = ["is_loopback", "send_status", "status_report"]


def is_loopback(scope: Scope) -> bool:
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


async def send_status(
    scope: Scope,
    send: Send,
    request_id: bytes,
    registry: Registry,
    scraper: MetricsScraper,
    proxy: Proxy,
) -> None:
    try:
        if scope["method"] != "GET":
            raise GatewayError(ErrorCode.method_not_allowed, "/admin/status accepts only GET")
        if not is_loopback(scope):
            raise GatewayError(
                ErrorCode.permission_denied, "/admin/status answers loopback clients only"
            )
    except GatewayError as error:
        await send_error(send, error, request_id)
        return
    await send_json(send, 200, status_report(registry, scraper, proxy), request_id)


def status_report(registry: Registry, scraper: MetricsScraper, proxy: Proxy) -> dict[str, Any]:
    """Per backend: health, breaker, in-flight, scraped load, staleness, slots and score."""
    models_of: dict[str, list[str]] = {}
    for name, routes in registry.routes.items():
        for route in routes:
            models_of.setdefault(route.backend.id, []).append(name)
    backends = [
        _backend(registry, scraper, proxy, b, sorted(models_of.get(b.id, ())))
        for b in registry.backends.values()
    ]
    queues = {
        name: {
            "waiting": queue.waiting,
            "size": queue.settings.size,
            "max_wait_s": queue.settings.max_wait_s,
            "threshold": queue.settings.threshold,
        }
        for name, queue in sorted(proxy.queues.items())
    }
    return {"backends": backends, "queues": queues}


def _backend(
    registry: Registry,
    scraper: MetricsScraper,
    proxy: Proxy,
    backend: BackendState,
    models: list[str],
) -> dict[str, Any]:
    now = registry.clock()
    breaker = backend.breaker
    load = scraper.load(backend.id)
    age = scraper.age(backend.id)
    configured = backend.config.capacity.max_concurrency
    if not backend.config.is_private:
        health = "hosted"
    elif backend.health_error is not None:
        health = "unhealthy"
    elif backend.config.kind in ("vllm", "llamacpp", "sglang"):
        health = "healthy"
    else:
        health = "unprobed"  # `openai` kind: no /health to probe; the breaker judges it
    retry_in = None
    if breaker.state is BreakerState.open:
        retry_in = round(max(0.0, breaker.open_until - now), 3)
    return {
        "id": backend.id,
        "kind": backend.config.kind,
        "models": models,
        "available": not registry.is_down(backend),
        "health": health,
        "health_error": backend.health_error,
        "breaker": {
            "state": breaker.state.value,
            "failures": breaker.failures,
            "opens": breaker.opens,
            "retry_in_s": retry_in,
            "last_error": breaker.last_error,
        },
        "inflight": backend.inflight,
        "inflight_global": backend.global_inflight,
        "prefilling_tokens": backend.prefilling,
        "slots": configured or backend.learned_slots,
        "slots_from": "config" if configured else ("learned" if backend.learned_slots else None),
        "running": None if load is None else load.running,
        "waiting": None if load is None else load.waiting,
        "kv_usage": None if load is None else load.kv_usage,
        "metrics_age_s": None if age is None else round(age, 3),
        "metrics_stale": load is None and age is not None,
        "metrics_error": scraper.failure(backend.id),
        "scores": {m: round(proxy.score(m, backend), 4) for m in models}
        if backend.config.is_private
        else {},
    }
