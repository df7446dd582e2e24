"""Reloading gateway.yaml in a running gateway, without dropping a connection.

SIGHUP (and a poll of the file's and the keys file's mtime) loads the file again through
the same strict loader as startup. A file that fails validation, or whose trust policies
no longer compile against its backends, leaves the running config untouched: the failure
is logged, counted (`owngate_config_reload_failures_total`) and shown in the readiness detail, as a
failed policy reload is. A valid file is assembled completely (backend registry, trust
policies, scraper, router) and swapped in, one reference per part: requests already
running finish on the parts they started with; the connections of a removed or changed
backend close once the requests that were running at the swap are done (bounded by
`limits.drain_timeout_s`). Unchanged backends keep their connection pools, in-flight
counts and health. Settings only a restart can change (`listen`, `provenance`, `state`,
`logging`) keep their running values, and the log says "needs restart".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.config.loader import ConfigError, load_config
from gateway.config.schema import GatewayConfig
from gateway.logs import get_logger
from gateway.policy import PolicyError
from gateway.routing.registry import BackendState, Registry, Route

if TYPE_CHECKING:
    from gateway.api.app import GatewayApp
    from gateway.api.proxy import Proxy
    from gateway.policy_set import TrustPolicies
    from gateway.routing.scraper import MetricsScraper

__all__ = ["RESTART_ONLY", "Assembly", "ConfigReloader", "keep_unchanged_backends"]

RESTART_ONLY = ("listen", "provenance", "state", "logging")


@dataclass(frozen=True, slots=True)
class Assembly:
    """The parts of a gateway that are built from its config."""

    config: GatewayConfig
    registry: Registry
    trust: TrustPolicies
    scraper: MetricsScraper
    proxy: Proxy


def keep_unchanged_backends(registry: Registry, previous: Registry, same_limits: bool) -> None:
    """Give `registry` the running state (pool, in-flight count, health) of every backend
    whose settings did not change, so a reload costs it nothing."""
    if not same_limits:  # timeouts and pool sizes live in the pools: rebuild them all
        return
    kept: dict[str, BackendState] = {}
    for backend_id, state in registry.backends.items():
        old = previous.backends.get(backend_id)
        if old is not None and old.config == state.config:
            old.breaker.settings = state.breaker.settings  # routing.breaker may have changed
            kept[backend_id] = old
    if not kept:
        return
    registry.backends.update(kept)
    registry.routes = {
        name: tuple(Route(kept.get(r.backend.id, r.backend), r.upstream_model) for r in routes)
        for name, routes in registry.routes.items()
    }


class ConfigReloader:
    """Owns reloads of one config file for one app (see the module docstring)."""

    def __init__(
        self,
        app: GatewayApp,
        path: Path,
        *,
        prepare: Callable[[GatewayConfig], GatewayConfig] = lambda config: config,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._app = app
        self.path = path
        self._prepare = prepare  # what `serve` does to a loaded file (per-worker log, ...)
        self.interval_s = interval_s
        self._clock = clock
        self._log = get_logger("owngate.config")
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()  # reloads and retirements under way
        self.reload_failures = 0
        self.last_error: str | None = None
        self.loaded_at = clock()
        self._stamp = self._fingerprint()

    def _fingerprint(self) -> tuple[tuple[int, int], ...]:
        files = [self.path]
        keys_file = self._app.config.keys_file
        if keys_file is not None:
            files.append(self.path.parent / keys_file)
        stamps = []
        for file in files:
            try:
                info = file.stat()
            except OSError:
                stamps.append((-1, -1))
                continue
            stamps.append((info.st_mtime_ns, info.st_size))
        return tuple(stamps)

    async def watch(self) -> None:
        """Poll the files; reload when one changes. Cancel to stop."""
        while True:
            await asyncio.sleep(self.interval_s)
            if self._fingerprint() != self._stamp:
                await self.reload()

    def trigger(self) -> None:
        """Reload soon (SIGHUP): on the event loop, after any reload already running."""
        task = asyncio.create_task(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> bool:
        """Load the file again; True if a changed config became active."""
        async with self._lock:
            return await self._reload()

    async def _reload(self) -> bool:
        app = self._app
        self._stamp = self._fingerprint()
        try:
            fresh = self._prepare(load_config(self.path))
        except ConfigError as exc:
            return self._failed(f"{len(exc.issues)} problem(s); first: {exc.issues[0]}", exc)
        fresh = self._pin_restart_only(app.config, fresh)
        if fresh == app.config:
            app.trust.reload()  # only the policy files may have changed
            self._succeeded()
            return False
        try:
            parts = app.assemble(fresh)
        except (PolicyError, ValueError) as exc:
            return self._failed(str(exc).splitlines()[0], exc)
        await parts.scraper.scrape_once()  # know the new backends' health before routing
        running = set(app.serving)
        old_registry, old_proxy, old_config = app.registry, app.proxy, app.config
        app.install(parts)
        for task in app.start_watchers():
            task.cancel()
        self._succeeded()
        self._log.info("config reloaded", **_changes(old_config, fresh))
        retiring = [
            b for b in old_registry.backends.values() if parts.registry.backends.get(b.id) is not b
        ]
        task = asyncio.create_task(self._retire(running, retiring, old_proxy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _retire(
        self, running: set[asyncio.Task[Any]], backends: list[BackendState], proxy: Proxy
    ) -> None:
        """Close what the old config used once the requests running at the swap are done."""
        if running:
            await asyncio.wait(running, timeout=self._app.config.limits.drain_timeout_s)
        for backend in backends:
            if backend.pool is not None:
                await backend.pool.close()
        await proxy.close()

    def _pin_restart_only(self, running: GatewayConfig, fresh: GatewayConfig) -> GatewayConfig:
        kept: dict[str, Any] = {}
        for name in RESTART_ONLY:
            if getattr(fresh, name) != getattr(running, name):
                kept[name] = getattr(running, name)
                self._log.warning(
                    "config setting changed; needs restart, the running value is kept",
                    setting=name,
                )
        return fresh.model_copy(update=kept) if kept else fresh

    def _succeeded(self) -> None:
        self.last_error = None
        self.loaded_at = self._clock()

    def _failed(self, summary: str, exc: Exception) -> bool:
        self.reload_failures += 1
        self.last_error = summary
        self._log.error(
            "config reload failed; keeping the running config",
            path=str(self.path),
            problems=str(exc).splitlines()[:20],
        )
        return False

    def status(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "loaded_at": self.loaded_at,
            "last_reload_error": self.last_error,
            "reload_failures": self.reload_failures,
        }


def _changes(old: GatewayConfig, new: GatewayConfig) -> dict[str, Any]:
    """What a reload changed, by id (never a key hash)."""
    old_b = {b.id: b for b in old.backends}
    new_b = {b.id: b for b in new.backends}
    old_t = {t.id: t for t in old.tenants}
    new_t = {t.id: t for t in new.tenants}
    return {
        "backends_added": sorted(new_b.keys() - old_b.keys()),
        "backends_removed": sorted(old_b.keys() - new_b.keys()),
        "backends_changed": sorted(i for i in new_b.keys() & old_b.keys() if old_b[i] != new_b[i]),
        "tenants_added": sorted(new_t.keys() - old_t.keys()),
        "tenants_removed": sorted(old_t.keys() - new_t.keys()),
        "tenants_changed": sorted(i for i in new_t.keys() & old_t.keys() if old_t[i] != new_t[i]),
        "routing_changed": old.routing != new.routing,
        "limits_changed": old.limits != new.limits,
    }
