"""The runtime view of the configured backends and the models they serve.

Built from a `GatewaySettings` at startup (and again on a reload); the request path only
does dict lookups here. `routes` maps each public model name (names and aliases) to the
backends serving it; each `BackendState` carries what the gateway knows about its
backend now: in-flight and prefill counts (kept by the router's plans,
gateway/routing/router.py), the other replicas' in-flight count (shared state), its
circuit breakers (gateway/routing/breaker.py, and per tenant
gateway/routing/tenant_breakers.py) and its `/health` probe record
(gateway/routing/health.py). Which backends a request is offered, and in which order, is
the router's business; `Registry.is_down()` and `Registry.last_up()` answer the status
page and the health probes (is a backend the last one up for a model?).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gateway.config.schema import BackendSettings, BreakerSettings, GatewaySettings, LimitSettings
from gateway.listener_limits import ListenerLimits
from gateway.routing.breaker import Breaker
from gateway.routing.filters.health import unavailable
from gateway.routing.health import ProbeHealth
from gateway.routing.tenant_breakers import TenantBreakers
from gateway.upstream.http import HttpPool
from gateway.upstream.sockets import BackendSockets
from gateway.upstream.tenant_share import TenantShare, hosted_calls, share_cap
from gateway.upstream.tls import BackendTLS, backend_tls

__all__ = ["BackendState", "Registry", "Route"]


@dataclass(eq=False, slots=True)
class BackendState:
    """A configured backend plus what the gateway knows about it right now."""

    config: BackendSettings
    pool: HttpPool | None
    base_path: bytes
    auth_header: bytes | None
    tls: BackendTLS | None = None  # an https backend's CA, client certificate and pins
    # A hosted backend's calls in flight per tenant, bounded by its share (tenant_share.py)
    calls: TenantShare | None = None
    inflight: int = 0  # this gateway's requests to it now
    # Estimated prompt tokens of this gateway's requests to it that have no first byte
    # yet: the prefill work queued ahead of a new request (updated at dispatch and first
    # byte), which is what its time to first token waits for.
    prefilling: int = 0
    peer_inflight: int = 0  # other replicas' (shared state), as of the last sync
    # passive health: failed exchanges open it, half-open probes close it
    breaker: Breaker = field(default_factory=lambda: Breaker(BreakerSettings()))
    # passive health per tenant: what one tenant's requests alone made it fail
    tenant_breakers: TenantBreakers = field(default_factory=TenantBreakers)
    learned_slots: int | None = None  # llama.cpp's slot count (/props), when not configured
    unhealthy_until: float = 0.0  # active health: marked down by its /health probes
    health_error: str | None = None
    probe: ProbeHealth = field(default_factory=ProbeHealth)  # its /health probes so far
    # Answers relayed from it (response headers below 500, stream chunks): evidence that
    # it is alive which the health probes read (a busy server may answer /health late).
    answered: int = 0
    # `config.id`, read a dozen times per request by the router and relays: an attribute,
    # not a property (a Python call each); `config` is frozen and never replaced.
    id: str = field(init=False)
    # `config.capacity.max_concurrency`, read by the load model for every candidate of
    # every request: a pydantic model's attribute is no specialized load (its class has a
    # `__getattr__`), some 15 times the cost of a plain attribute's.
    max_concurrency: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.config.id
        self.max_concurrency = self.config.capacity.max_concurrency

    @property
    def share(self) -> TenantShare | None:
        """Each tenant's share of it: its pool's connections, or a hosted backend's calls."""
        return self.pool.share if self.pool is not None else self.calls

    @property
    def global_inflight(self) -> int:
        """Requests in flight to it from every gateway replica: the routing signal."""
        return self.inflight + self.peer_inflight


@dataclass(frozen=True, slots=True)
class Route:
    """How one public model name is served by one backend."""

    backend: BackendState
    upstream_model: str


@dataclass(slots=True)
class Registry:
    backends: dict[str, BackendState]
    routes: dict[str, tuple[Route, ...]]
    # Per public name, (backend id, owner) of each backend serving it, in gateway.yaml
    # order: `/v1/models` names the owner of the first one the tenant's policy admits.
    owners: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    # Whether breakers tell tenants apart (more than one tenant configured that may use
    # some model): see gateway/routing/tenant_breakers.py. One: its failures open the
    # backend's breaker, as they always did.
    per_tenant: bool = False
    # Pools that older configs built for backends this one lacks (removed by a reload, or
    # made plain HTTP), still used by requests of those configs: a later config that has
    # the backend over TLS again takes them along (`hand_over_tls`). Held weakly.
    orphans: dict[str, weakref.WeakSet[HttpPool]] = field(default_factory=dict)
    # The registry of the config a reload installed after this one's (set by the app's
    # `install`): the requests still running on this one check each attempt against it.
    successor: Registry | None = None
    # The count of backend connections the pools share (`BackendSockets`), handed on to
    # the registry a reload builds (`build(sockets=)`); a registry made directly: none.
    sockets: BackendSockets = field(default_factory=lambda: BackendSockets(1 << 30))

    @classmethod
    def build(
        cls,
        config: GatewaySettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        environ: dict[str, str] | None = None,
        config_dir: Path | None = None,
        sockets: BackendSockets | None = None,
        worker: tuple[int, int] = (1, 1),
    ) -> Registry:
        """The backends and routes of `config`. Raises ValueError naming every backend
        whose key variable is unset or unusable, or whose TLS files (relative to
        `config_dir`, default the working directory) cannot be used, one per line.
        `sockets`: the count the running registry's pools share, which a reload's pools
        join (None: a new one, within what the listener's cap leaves them). `worker`:
        this process's place (i, N) among `serve --workers N`'s, whose pools each hold a
        tenant to part i of its share (`share_cap`)."""
        directory = Path.cwd() if config_dir is None else config_dir
        env = environ or {}
        breaker = config.routing.breaker
        problems: list[str] = []
        unreadable: OSError | None = None
        backends: dict[str, BackendState] = {}
        tenants = sum(bool(t.models) for t in config.tenants)  # those that may use a model
        if sockets is None:  # backend connections, idle ones too, within the cap's share
            sockets = BackendSockets(ListenerLimits.from_config(config.listen).max_connections)
        for backend in config.backends:
            try:
                backends[backend.id] = _backend_state(
                    backend, config.limits, breaker, env, directory, sockets, tenants, worker
                )
            except ValueError as exc:
                problems.append(str(exc))
                if isinstance(exc.__cause__, OSError):  # a TLS file unreadable, not invalid
                    unreadable = unreadable or exc.__cause__
        routes: dict[str, list[Route]] = {}
        owners: dict[str, list[tuple[str, str]]] = {}
        for backend in config.backends:
            if backend.id not in backends:
                continue
            for entry in backend.models:
                for public in (entry.name, *entry.aliases):
                    routes.setdefault(public, []).append(Route(backends[backend.id], entry.name))
                    owners.setdefault(public, []).append((backend.id, backend.owner))
        if problems:
            # its cause says a file could not be read: a reload reads it again unchanged
            raise ValueError("\n".join(problems)) from unreadable
        return cls(
            backends=backends,
            routes={name: tuple(r) for name, r in routes.items()},
            owners={name: tuple(o) for name, o in owners.items()},
            clock=clock,
            per_tenant=tenants > 1,
            sockets=sockets,
        )

    def set_peer_inflight(self, others: Mapping[str, int]) -> None:
        """Take the other replicas' in-flight counts per backend (after a shared-state
        sync; empty while the store is away)."""
        for backend_id, backend in self.backends.items():
            backend.peer_inflight = others.get(backend_id, 0)

    def is_down(self, backend: BackendState) -> bool:
        return unavailable(backend, self.clock())

    def last_up(self, backend: BackendState) -> bool:
        """Whether some model `backend` serves has no other private backend up now: then
        taking it out would leave that model nothing private to route to."""
        now = self.clock()
        for routes in self.routes.values():
            if all(r.backend.id != backend.id for r in routes):
                continue
            if not any(
                r.backend.id != backend.id
                and r.backend.config.is_private
                and not unavailable(r.backend, now)
                for r in routes
            ):
                return True
        return False

    def tls_files(self) -> tuple[Path, ...]:
        """The TLS files (CA, client certificate and key) its backends were built from."""
        return tuple(path for b in self.backends.values() if b.tls for path in b.tls.files)

    def tls_changed(self) -> list[str]:
        """The backends whose TLS files now read differently from when they were built:
        a reload must rebuild them even when gateway.yaml did not change."""
        return [b.id for b in self.backends.values() if b.tls and b.tls.files_changed()]

    def hand_over_tls(self, successor: Registry) -> None:
        """After a reload installed `successor`: every backend of this (retiring) registry
        that `successor` rebuilt with other TLS settings or files authenticates its new
        connections with the successor's and drops its idle ones (`HttpPool.retrust`).
        Requests that began before the reload finish on this registry; a failover attempt
        among them must not open or reuse a connection the new files refuse (a CA
        withdrawn by replacing `ca.pem` is withdrawn at once). Every backend `successor`
        rebuilt over TLS takes its old pool along (`HttpPool.succeed`): a later reload's
        settings reach the requests of this registry too, not only those of `successor`.

        A backend is its id, wherever it is: one that moved to another host or port has
        its old pool's new connections checked with the new settings too (the new CA,
        name and pins, and the old pins and facts: only a server both accept). A pool
        whose backend `successor` lacks (removed) or reaches in plain HTTP is kept, held
        weakly, in `successor.orphans`, so a later config that brings the backend back
        over TLS takes it along: a pin withdrawn meanwhile is withdrawn from it too."""
        for backend in self.backends.values():
            if backend.pool is not None and successor.backends.get(backend.id) is not backend:
                _hand_over(backend.id, backend.pool.lineage, successor)
        for backend_id, pools in self.orphans.items():
            _hand_over(backend_id, [p for p in pools if not p.closed], successor)

    def moved(self, backend_id: str) -> str | None:
        """Why a request still running on this registry must not reach its backend
        `backend_id` any more: the newest config (`successor`, after reloads) has no
        backend of that id, or gives it another address (`base_url`) or other TLS
        settings or files (CA, client certificate and key, `server_name`, pins,
        certificate identity: `_reach`), or another `attest` key (whose sidecar
        countersignatures its answers). None: it is reached at the same place the same
        way (or is not one of this registry's). An operator moves a backend or rotates
        its pin, CA or sidecar key because the old address or key is no longer trusted: a
        request planned before the reload skips it, never sending to the old address, nor
        to the new one its plan was not made for (gateway/api/decided.py)."""
        mine = self.backends.get(backend_id)
        latest = self
        while latest.successor is not None:
            latest = latest.successor
        if mine is None or latest is self:
            return None
        now = latest.backends.get(backend_id)
        if now is mine:  # kept unchanged by every reload since
            return None
        if now is None:
            return f"{backend_id}: removed by a config reload"
        if _reach(now) != _reach(mine):
            return f"{backend_id}: its address or TLS settings changed by a config reload"
        if now.config.attest != mine.config.attest:  # a sidecar key rotated: maybe leaked
            return f"{backend_id}: its attest key changed by a config reload"
        return None

    def newest(self, backend_id: str) -> BackendState | None:
        """The backend `backend_id` of the newest config (`successor`, after reloads), or
        None where it has none: what a narrowing of its settings (`media_urls`) holds
        the requests still running on this registry to."""
        latest = self
        while latest.successor is not None:
            latest = latest.successor
        return latest.backends.get(backend_id)

    async def close(self) -> None:
        for backend in self.backends.values():
            if backend.pool is not None:
                await backend.pool.close()


def _reach(backend: BackendState) -> tuple[str | None, str | None, str | None]:
    """Where and how the gateway reaches `backend`: its `base_url` and, over TLS, the
    digest of its TLS settings and files (CA, client certificate and key, pins,
    certificate identity) and the name its certificate is checked for."""
    tls = backend.tls
    if tls is None:
        return backend.config.base_url, None, None
    return backend.config.base_url, tls.digest, tls.server_name


def _hand_over(backend_id: str, pools: Iterable[HttpPool], successor: Registry) -> None:
    """Link the TLS pools of `backend_id` from older configs to `successor`'s pool of it,
    or keep them as its orphans."""
    new = successor.backends.get(backend_id)
    for pool in pools:
        if pool.tls is None:  # plain HTTP: no TLS settings to hand over
            continue
        if new is None or new.pool is None or new.tls is None:
            successor.orphans.setdefault(backend_id, weakref.WeakSet()).add(pool)
            continue
        if pool.tls.digest != new.tls.digest:
            pool.retrust(new.tls)
        new.pool.succeed(pool)


def _backend_state(
    backend: BackendSettings,
    limits: LimitSettings,
    breaker: BreakerSettings,
    env: dict[str, str],
    config_dir: Path,
    sockets: BackendSockets,
    tenants: int,
    worker: tuple[int, int] = (1, 1),
) -> BackendState:
    pool: HttpPool | None = None
    base_path = b""
    tls: BackendTLS | None = None
    # A tenant's share of the backend: of a pool's connections, or of hosted calls (as
    # many as LiteLLM's connector makes at once, at most).
    most = limits.max_connections_per_backend
    most = most if backend.is_private else hosted_calls(most)
    cap = share_cap(most, limits.tenant_share_of_backend, tenants, *worker)
    if backend.base_url is not None and backend.is_private:
        parts = urlsplit(backend.base_url)
        if parts.scheme == "https" and parts.hostname is not None:
            tls = backend_tls(backend, parts.hostname, config_dir)
        pool, base_path = HttpPool.for_url(
            backend.base_url,
            connect_timeout=limits.connect_timeout_s,
            first_byte_timeout=backend.first_byte_timeout_s or limits.first_byte_timeout_s,
            read_timeout=limits.read_timeout_s,
            max_connections=limits.max_connections_per_backend,
            max_body=limits.max_response_bytes,
            response_timeout=limits.response_timeout_s,
            stream_timeout=limits.stream_timeout_s,
            tls=tls,
            sockets=sockets,
            tenant_cap=cap,
        )
    key = backend.api_key
    if backend.api_key_env is not None and backend.is_private:
        key = env.get(backend.api_key_env)
        if key is None:  # fail closed: requests without the key would all be refused
            raise ValueError(
                f"backend {backend.id}: environment variable {backend.api_key_env} is not set"
            )
    if key is not None:
        key = key.strip()
        if not key or not key.isascii() or not key.isprintable() or " " in key:
            raise ValueError(f"backend {backend.id}: the API key has characters HTTP cannot carry")
    auth = f"Bearer {key}".encode() if key and backend.is_private else None
    return BackendState(
        config=backend,
        pool=pool,
        base_path=base_path,
        auth_header=auth,
        tls=tls,
        calls=None if backend.is_private else TenantShare(cap),
        breaker=Breaker(backend.breaker or breaker),
    )
