"""The admin surface: `GET /admin/status`, what routing knows about every backend and the
gateway's readiness detail, for `owngate status`.

It names backends, their load and breakers, the policy digest and the shared state, so
it answers only admins (`authorize`, the one check): a client that sends
`Authorization: Bearer TOKEN` with a token whose SHA-256 digest is in
`admin.token_hashes`, or, with `admin.allow_loopback: true` (the demo), any client on a
loopback address. The source address alone is never enough by default: a service-mesh
sidecar forwards every remote client from 127.0.0.6. With neither set the surface is
off (403).

"A loopback client" is the socket's own peer (owngate's servers take no proxy headers:
`gateway.serving.uvicorn_config`), and a request that names a client in a forwarding
header (`Forwarded`, `X-Forwarded-For`, `X-Real-IP`, `Via`, a CDN's `True-Client-IP`
and the like: `_FORWARDING`) is never one: a proxy on this host
forwarded it from elsewhere. Nor is a request a browser on this host sent for a web page
of another origin (`sent_from_elsewhere`): any site the operator visits could otherwise
drain or reload a demo gateway with a form post, and, through a DNS name rebound to
127.0.0.1, read and call the whole admin API (create a tenant key and read it back).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import orjson

from gateway.asgi import PRIVATE_ANSWER, Scope, Send, header_values, send_bytes, send_error
from gateway.config.schema import AdminSettings
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.breaker import BreakerState
from gateway.routing.registry import BackendState, Registry
from gateway.routing.scraper import MetricsScraper

if TYPE_CHECKING:
    from gateway.api.proxy import Proxy

__all__ = [
    "ADMIN_ANSWER",
    "LOOPBACK_REFUSED",
    "authorize",
    "authorize_metrics",
    "backend_detail",
    "is_loopback",
    "loopback_admitted",
    "send_status",
    "sent_from_elsewhere",
    "status_report",
]

# What an admin answer on the public listener (`/admin/status`, `/metrics` under
# `listen.metrics: admin`) says, as every answer of the admin listener does
# (gateway/admin/headers.py): each tenant's policies, data classes and backends, for the
# admin alone.
ADMIN_ANSWER: Final = PRIVATE_ANSWER

# Headers a proxy adds to name the client it forwards (or itself, `via`): the standard
# ones, nginx's and Apache's, and those CDNs and load balancers set.
_FORWARDING = frozenset(
    (
        b"forwarded",
        b"x-forwarded-for",
        b"x-real-ip",
        b"via",
        b"x-forwarded-host",
        b"x-client-ip",
        b"client-ip",
        b"true-client-ip",
        b"cf-connecting-ip",
        b"fastly-client-ip",
        b"x-cluster-client-ip",
        b"x-original-forwarded-for",
    )
)


def is_loopback(scope: Scope) -> bool:
    """Whether the peer of `scope`'s connection is on a loopback address and the request
    was not forwarded to it by a proxy (it names no client in a forwarding header)."""
    client = scope.get("client")
    if not client or any(name in _FORWARDING for name, _ in scope["headers"]):
        return False
    return _loopback_address(client[0])


def _loopback_address(text: str) -> bool:
    """Whether `text` is a loopback address: 127.0.0.0/8, ::1, or an IPv4-mapped loopback
    (`::ffff:127.0.0.1`: how a listener on `::` sees an IPv4 client of 127.0.0.1; Python
    3.11's `is_loopback` says no to it, 3.13's yes)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


# Sec-Fetch-Site values of a request the page's own origin sent, or a user typed.
_OWN_FETCH = frozenset((b"same-origin", b"none"))
LOOPBACK_REFUSED = (
    "send the admin token as 'Authorization: Bearer TOKEN' (a loopback client is admitted "
    "without one only under a loopback address or localhost, and never for a web page of "
    "another origin)"
)


def sent_from_elsewhere(scope: Scope) -> bool:
    """Whether a browser sent `scope`'s request for a page that is not the listener's own:
    its `Host` is not a loopback address or `localhost` (a DNS name rebound to 127.0.0.1:
    the page is the attacker's, now same-origin with the listener), its `Origin` is not
    that host's (a cross-site form post or `fetch`), or its `Sec-Fetch-Site` says
    cross-site or same-site (another port's page). A tool such as curl or `owngate
    status` sends a loopback `Host` and neither of the others."""
    hosts = header_values(scope, b"host")
    if len(hosts) > 1 or (hosts and not _loopback_host(hosts[0].decode("latin-1").lower())):
        return True
    host = hosts[0].decode("latin-1").lower() if hosts else None
    own = {f"http://{host}", f"https://{host}"} if host is not None else set()
    if any(value.decode("latin-1").lower() not in own for value in header_values(scope, b"origin")):
        return True
    return any(value.lower() not in _OWN_FETCH for value in header_values(scope, b"sec-fetch-site"))


def _loopback_host(host: str) -> bool:
    """Whether a `Host` value (lower case) names a loopback address or `localhost`."""
    if host.startswith("["):  # an IPv6 literal, then an optional :port
        name, found, port = host[1:].partition("]")
        if not found or (
            port and not (port.startswith(":") and port[1:].isascii() and port[1:].isdigit())
        ):
            return False
    else:
        name, colon, port = host.partition(":")
        if colon and not (port.isascii() and port.isdigit()):
            return False
    return name == "localhost" or _loopback_address(name)


def loopback_admitted(scope: Scope) -> bool:
    """Whether `admin.allow_loopback` admits `scope`'s request without a token: a loopback
    peer (`is_loopback`) that no web page of another origin sent (`sent_from_elsewhere`)."""
    return is_loopback(scope) and not sent_from_elsewhere(scope)


def authorize(scope: Scope, settings: AdminSettings, roles: tuple[str, ...] = ()) -> None:
    """Return if the request may read the admin surface (a full-access token, or one of
    `roles` from `admin.tokens`); raise `GatewayError` otherwise (401 without or with a
    wrong token, 403 when no admin access is configured)."""
    values = header_values(scope, b"authorization")
    if len(values) > 1:
        raise GatewayError(ErrorCode.invalid_api_key, "Send one Authorization header.")
    if values:
        scheme, _, token = values[0].partition(b" ")
        token = token.strip()
        held = (*settings.token_hashes, *(t.hash for t in settings.tokens if t.role in roles))
        if scheme.lower() == b"bearer" and token and _known(token, held):
            return
        raise GatewayError(ErrorCode.invalid_api_key, "Incorrect admin token.")
    if settings.allow_loopback and loopback_admitted(scope):
        return
    if settings.allow_loopback and is_loopback(scope):
        raise GatewayError(ErrorCode.missing_api_key, LOOPBACK_REFUSED)
    if not settings.token_hashes and not any(t.role in roles for t in settings.tokens):
        raise GatewayError(
            ErrorCode.permission_denied,
            "the admin surface is off: configure admin.token_hashes (or, for a "
            "single-host demo, admin.allow_loopback)",
        )
    raise GatewayError(
        ErrorCode.missing_api_key,
        "send the admin token as 'Authorization: Bearer TOKEN'",
    )


_METRICS_ROLES = ("operator",)  # `admin.tokens` roles that read /metrics (a scraper's)
_METRICS_LOOPBACK_ONLY = (
    "/metrics answers loopback clients only (a loopback peer that sends a loopback or "
    "localhost Host, no forwarding header, and no Origin or Sec-Fetch-Site of another "
    "site): listen.metrics is 'admin' (the default) and no admin token is configured; "
    "scrape with an operator token (admin.tokens), or set listen.metrics: open to show it "
    "to anyone who reaches this listener"
)
_METRICS_NO_READER = (
    "/metrics answers a full-access or operator admin token (listen.metrics is 'admin', "
    "the default), and no admin token configured here is one: add an operator token for "
    "the scraper (admin.tokens), or set listen.metrics: open to show it to anyone who "
    "reaches this listener"
)


def authorize_metrics(scope: Scope, settings: AdminSettings) -> None:
    """Return if the request may read `/metrics` under `listen.metrics: admin`; raise
    `GatewayError` otherwise. With admin access that reads it configured (a full-access
    token, an `operator` token or `admin.allow_loopback`), as `authorize`; with admin
    tokens of other roles only, no one (403 naming `listen.metrics`): a configured token
    says the source address admits no one, as behind a mesh sidecar every client is a
    loopback one. With no admin access at all, a loopback client (the socket's peer, never
    a header: `loopback_admitted`) may, so a local Prometheus and the quickstart's curl
    read it, and everyone else is 403 naming `listen.metrics`."""
    if (
        settings.token_hashes
        or settings.allow_loopback
        or any(t.role in _METRICS_ROLES for t in settings.tokens)
    ):
        authorize(scope, settings, roles=_METRICS_ROLES)
    elif settings.tokens:
        raise GatewayError(ErrorCode.permission_denied, _METRICS_NO_READER)
    elif not loopback_admitted(scope):
        raise GatewayError(ErrorCode.permission_denied, _METRICS_LOOPBACK_ONLY)


def _known(token: bytes, hashes: tuple[str, ...]) -> bool:
    """Whether `token` hashes to one of `hashes`, comparing every one in constant time."""
    digest = ("sha256:" + hashlib.sha256(token).hexdigest()).encode()
    found = False
    for stored in hashes:
        found |= hmac.compare_digest(digest, stored.encode())
    return found


async def send_status(
    scope: Scope,
    send: Send,
    request_id: bytes,
    settings: AdminSettings,
    report: Callable[[], dict[str, Any]],
) -> None:
    """Answer `GET /admin/status` with `report()`, for admins only."""
    try:
        if scope["method"] != "GET":
            raise GatewayError(ErrorCode.method_not_allowed, "/admin/status accepts only GET")
        authorize(scope, settings)
    except GatewayError as error:
        await send_error(send, error, request_id)
        return
    await send_bytes(send, 200, orjson.dumps(report()), request_id, extra=ADMIN_ANSWER)


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
        for name, queue in sorted(proxy.router.queues.items())
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
        "proxy": backend.config.proxy,
        "available": not registry.is_down(backend),
        "health": health,
        "health_error": backend.health_error,
        "breaker": {
            "state": breaker.state.value,
            "failures": breaker.failures,
            "opens": breaker.opens,
            "retry_in_s": retry_in,
            "last_error": breaker.last_error,
            "tenants": _tenant_breakers(backend, now),
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
        "scores": {m: round(proxy.router.score(m, backend), 4) for m in models}
        if backend.config.is_private
        else {},
    }


def _tenant_breakers(backend: BackendState, now: float) -> list[dict[str, Any]]:
    """The breakers scoped to one tenant (gateway/routing/tenant_breakers.py) that hold
    failures: each tenant's requests alone made the backend fail (tenant ids from the
    configuration; the reason is the gateway's own words)."""
    return [
        {
            "tenant": tenant,
            "state": breaker.state.value,
            "failures": breaker.failures,
            "retry_in_s": round(max(0.0, breaker.open_until - now), 3)
            if breaker.state is BreakerState.open
            else None,
            "last_error": breaker.last_error,
        }
        for tenant, breaker in backend.tenant_breakers.items()
    ]


def backend_detail(
    registry: Registry, scraper: MetricsScraper, backend: BackendState
) -> dict[str, Any]:
    """One backend as the readiness detail shows it (admins only)."""
    load = scraper.load(backend.id)
    age = scraper.age(backend.id)
    return {
        "kind": backend.config.kind,
        "available": not registry.is_down(backend),
        "breaker": backend.breaker.state.value,
        "health_error": backend.health_error,
        "inflight": backend.inflight,
        "peer_inflight": backend.peer_inflight,
        "metrics_age_s": None if age is None else round(age, 3),
        "metrics_error": scraper.failure(backend.id),
        "running": None if load is None else load.running,
        "waiting": None if load is None else load.waiting,
        "kv_usage": None if load is None else load.kv_usage,
    }
