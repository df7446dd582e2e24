"""The composition root: the one place that builds a gateway from a loaded config.

`assemble(config, environ)` builds every part the request path needs (`Assembly`: the
backend registry, the tenant key index, the trust policies compiled against the
backends, the metrics scraper, the proxy, and the process's metrics, shared state and
provenance recorder), or raises one `AssemblyError` naming every problem only checkable
here (a backend's key variable missing from the environment, one key hash listed for two
tenants, policies that do not compile against the backends), so a config is fixed in one
round. `owngate serve` and the demo build the app with `create_app`; a config reload
assembles the new config with the running parts (`ConfigReloader` gets `assemble` and
the app's `install` as callables); `owngate config validate` runs
`gateway.validation.validate`, the same assembly without the app.

Nothing connects or opens a file here: backend connections, Redis and the provenance
log open in the ASGI lifespan (`GatewayApp`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.api.app import GatewayApp
from gateway.api.metrics import GatewayMetrics
from gateway.api.parts import Assembly
from gateway.api.proxy import Proxy
from gateway.api.recorder import Recorder
from gateway.api.recorder_log import asks_new_log_origin
from gateway.api.reload import ConfigReloader
from gateway.config.env_refs import unquoted
from gateway.config.issues import ConfigError, ConfigIssue
from gateway.config.loader import load_config_text
from gateway.config.schema import GatewaySettings, StateSettings
from gateway.label_header import header_pin
from gateway.logs import get_logger
from gateway.policy import PolicyError
from gateway.policy_set import TrustPolicies
from gateway.routing.registry import BackendState, Registry, Route
from gateway.routing.scraper import MetricsScraper
from gateway.state import SharedState, create_state, limit_copies, limit_part, unsplittable
from gateway.state.memory import restarted_worker
from gateway.tenants import TenantEntry, index_keys, tenant_limits
from gateway.tracing import tracing_settings
from gateway.upstream.hosted import hosted_api_key
from gateway.upstream.litellm_runtime import check_base_url_environment
from gateway.upstream.provider_regions import pinned_regions
from gateway.upstream.sockets import BackendSockets
from gateway.upstream.tenant_share import config_share_unsplittable

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gateway.serving import BesideServer

__all__ = [
    "Assembly",
    "AssemblyError",
    "admin_app",
    "admin_server",
    "assemble",
    "checked_parts",
    "create_app",
]


class AssemblyError(ValueError):
    """The gateway cannot be built from this config; `problems` lists every reason."""

    def __init__(self, problems: Sequence[str], *, unreadable: bool = False) -> None:
        self.problems = tuple(problems)
        # a file among them could not be read (out of descriptors): a reload reads it again
        self.unreadable = unreadable
        super().__init__("\n".join(self.problems))


def assemble(
    config: GatewaySettings,
    environ: Mapping[str, str],
    *,
    config_dir: Path,
    clock: Callable[[], float] = time.monotonic,
    running: Assembly | None = None,
    revocations_dir: Path | None = None,
) -> Assembly:
    """Every part of a gateway built from `config`.

    `environ` supplies backend keys; `config_dir` anchors the config's relative paths;
    `clock` is what backend health, breakers and scrape ages read. `running` is the
    assembly a config reload replaces: the new one keeps its metrics, shared state and
    recorder (one log for the process's life), and the backends whose settings did not
    change keep their connection pools, in-flight counts and health. `revocations_dir`
    anchors `state.revocations_file`, this host's revoked keys list, read as the state is
    built (None: no list, as for a config only validated).

    Raises `AssemblyError` (a ValueError) naming every problem, or the ValueError of a
    shared-state setting or an `OTEL_*` variable checkable only here (built first)."""
    if running is None:
        tracing = tracing_settings(environ)  # OpenTelemetry traces: off unless asked for
        metrics = GatewayMetrics()
        state = _shared_state(config.state, environ, revocations_dir)
        recorder = (
            None
            if config.provenance is None
            else Recorder(config.provenance, config_dir, new_origin=asks_new_log_origin(environ))
        )
    else:
        metrics, state, recorder = running.metrics, running.state, running.recorder
        tracing = running.tracing
    # One count of backend connections for the process: a reload's pools join it
    sockets = None if running is None else running.registry.sockets
    # With memory state, each worker of `serve --workers N` enforces its part of a limit
    parts = limit_copies(environ) if state.status().backend == "memory" else 1
    registry, tenants, policies = checked_parts(
        config, environ, config_dir, clock, sockets, parts, reloading=running is not None
    )
    if running is not None:
        _keep_unchanged_backends(registry, running.registry, config.limits == running.config.limits)
    scraper = MetricsScraper(
        registry.backends.values(),
        config.scrape,
        clock=clock,
        health=config.health,
        last_up=registry.last_up,
    )
    proxy = Proxy(
        registry,
        metrics,
        policies,
        scraper,
        environ=environ,
        hosted_timeout_s=config.limits.first_byte_timeout_s,
        routing=config.routing,
        state=state,
        max_response_bytes=config.limits.max_response_bytes,
        max_media_walk_values=config.limits.max_media_walk_values,
        response_timeout_s=config.limits.response_timeout_s,
        stream_timeout_s=config.limits.stream_timeout_s,
        read_timeout_s=config.limits.read_timeout_s,
        recorder=recorder,
    )
    return Assembly(
        config, registry, tenants, policies, scraper, proxy, metrics, state, recorder, tracing
    )


def checked_parts(
    config: GatewaySettings,
    environ: Mapping[str, str],
    config_dir: Path,
    clock: Callable[[], float],
    sockets: BackendSockets | None = None,
    parts: int = 1,
    *,
    reloading: bool = False,
) -> tuple[Registry, dict[str, TenantEntry], TrustPolicies]:
    """The backend registry, the tenant key index and the trust policies of `config`, or
    `AssemblyError` with every problem: backend key variables (private and hosted),
    tenant key hashes, every policy error (compiled against the configured backends),
    tenant limits too small to split over `parts` workers (`unsplittable`: refused at a
    start; at a reload (`reloading`) a warning, and every worker refuses those tenants'
    requests), and a tenant's share of a backend too small to split over this one's
    (`share_unsplittable`)."""
    problems = unsplittable(((t.id, tenant_limits(t)) for t in config.tenants), parts)
    if problems and reloading:
        # A limit lowered past the workers (to throttle a tenant) failed the reload: the
        # tenant kept its wider limit. Applied, no worker has a part of it, and each
        # refuses the tenant's requests (429, `MemoryState._part`) until it is raised.
        get_logger("owngate.config").warning(
            "tenant limits below the workers: every worker refuses these tenants' requests",
            problems=problems,
        )
        problems = []
    # Pools are each worker's own, whatever the state: each holds a tenant to its part
    workers = limit_copies(environ)
    problems += config_share_unsplittable(config, workers)
    registry: Registry | None = None
    unreadable: OSError | None = None
    try:
        registry = Registry.build(
            config,
            environ=dict(environ),
            clock=clock,
            config_dir=config_dir,
            sockets=sockets,
            worker=(limit_part(environ), workers),
        )
    except ValueError as exc:
        problems += str(exc).splitlines()  # Registry.build: one problem per line
        unreadable = exc.__cause__ if isinstance(exc.__cause__, OSError) else None
    tenants: dict[str, TenantEntry] = {}
    try:
        tenants = index_keys(config.tenants)
    except ValueError as exc:
        problems += str(exc).splitlines()
    for backend in config.backends:
        if backend.kind == "hosted":
            try:
                hosted_api_key(backend, environ)  # what HostedClient reads when it is built
                models = [m.provider_model or "" for m in backend.models]
                has_base_url = backend.base_url is not None
                check_base_url_environment(backend.id, models, environ, has_base_url=has_base_url)
                pinned_regions(
                    backend.id, backend.region, models, environ, base_url=backend.base_url
                )
            except ValueError as exc:
                problems.append(str(exc))
    policies: TrustPolicies | None = None
    unread = unreadable is not None
    try:
        policies = TrustPolicies(config, config_dir, pin=header_pin(environ))
        policies.among_workers = workers > 1  # stale while a read fails (policy_set.py)
    except PolicyError as exc:
        problems += [f"invalid trust policy: {issue}" for issue in exc.issues]
        unread = unread or exc.unreadable  # a policy file or directory to read again
    if registry is None or policies is None or problems:
        raise AssemblyError(problems, unreadable=unread) from unreadable  # a TLS file, or None
    return registry, tenants, policies


def _keep_unchanged_backends(registry: Registry, previous: Registry, same_limits: bool) -> None:
    """Give `registry` the running state (pool, in-flight count, health) of every backend
    whose settings did not change, so a reload costs it nothing."""
    if not same_limits:  # timeouts and pool sizes live in the pools: rebuild them all
        return
    kept: dict[str, BackendState] = {}
    for backend_id, state in registry.backends.items():
        old = previous.backends.get(backend_id)
        same_tls = old is not None and (old.tls and old.tls.digest) == (
            state.tls and state.tls.digest
        )  # the same settings with new certificate files on disk: a new pool
        if old is not None and old.config == state.config and same_tls:
            old.breaker.settings = state.breaker.settings  # routing.breaker may have changed
            if old.share is not None and state.share is not None:
                # a tenant's share depends on how many tenants the config has, not on
                # the backend's settings: a reload adding one bounds them from now on
                old.share.cap = state.share.cap
            kept[backend_id] = old
    if not kept:
        return
    registry.backends.update(kept)
    registry.routes = {
        name: tuple(Route(kept.get(r.backend.id, r.backend), r.upstream_model) for r in routes)
        for name, routes in registry.routes.items()
    }


def _shared_state(
    settings: StateSettings, environ: Mapping[str, str], revocations_dir: Path | None
) -> SharedState:
    """The configured state; in a worker of `serve --workers N`, its place among them.
    Reads this host's revoked keys list (raises `RevocationListError` when it cannot)."""
    return create_state(
        settings.backend,
        settings.url,
        replica_id=settings.replica_id,
        key_prefix=settings.key_prefix,
        timeout_s=settings.timeout_ms / 1000,
        sync_interval_s=settings.sync_interval_s,
        lease_ttl_s=settings.lease_ttl_s,
        max_connections=settings.max_connections,
        workers=limit_copies(environ),
        worker_index=limit_part(environ),
        restarted=restarted_worker(environ),
        revocations_file=(
            None if revocations_dir is None else revocations_dir / settings.revocations_file
        ),
    )


def create_app(
    config: GatewaySettings,
    *,
    environ: Mapping[str, str] | None = None,
    config_dir: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
    config_file: Path | None = None,
    prepare: Callable[[GatewaySettings], GatewaySettings] = lambda config: config,
    config_read_at: float | None = None,
    config_env: Mapping[str, str] | None = None,
) -> GatewayApp:
    """The gateway ASGI app for a validated config (raises what `assemble` raises).

    `config_dir` anchors relative paths in the config (policy files, this host's revoked
    keys list: none is kept without `config_dir`; default: the working directory);
    `environ` supplies `${...}`-free secrets such as backend keys (default: the
    process environment); `clock` is what backend health, breakers and scrape ages read
    (monotonic seconds). With `config_file`, the app reloads that file on SIGHUP and when
    it (or its keys file) changes, each loaded config passed through `prepare` first;
    `config_read_at` (`time.time()` when reading `config` began) spares the first look
    at the file a reload when nothing was written to it since well before then.
    `config_env` is what a reloaded file's `${VAR}`s read (default: the process
    environment, as `serve` read it at start; the demo fills its own variables).
    """
    env = dict(os.environ if environ is None else environ)
    directory = config_dir or Path.cwd()
    assembly = assemble(config, env, config_dir=directory, clock=clock, revocations_dir=config_dir)
    app = GatewayApp(assembly, directory)
    app.environ = env
    if config_file is not None:

        def reassemble(fresh: GatewaySettings, running: Assembly) -> Assembly:
            return assemble(fresh, env, config_dir=directory, clock=clock, running=running)

        reloader = ConfigReloader(
            config_file,
            current=lambda: app.parts,
            assemble=reassemble,
            install=app.install,
            prepare=prepare,
            read_at=config_read_at,
            environ=config_env,
            among_workers=limit_copies(env) > 1,  # stale while a read fails (reload.py)
        )
        app.reloader = reloader
        app.metrics.watch_config(lambda: reloader.reload_failures)
    return app


def admin_app(app: GatewayApp) -> FastAPI:
    """The admin API (gateway/admin/, FastAPI) of a running gateway app: it reads the
    same runtime and acts through the app's own reload and drain. Imported here, never
    by the public surface: the hot path does not load FastAPI."""
    from gateway.admin.app import create_admin_app
    from gateway.admin.candidate_files import outside_files, reading_roots
    from gateway.admin.control import AdminControl
    from gateway.api.operations import Operations
    from gateway.confined_reads import confined as confined_reads
    from gateway.validation import validate

    async def reload() -> bool:
        if app.reloader is None:
            return app.policies.reload()
        return await app.reloader.reload()

    def check(text: str) -> list[str]:
        # Every file validation opens is checked as opened, under the roots `confined`
        # checked its paths against: a link swapped in after that check is not read.
        with confined_reads(reading_roots(app.config, app.config_dir)):
            try:
                candidate = load_config_text(
                    text, app.config_dir, source="candidate", env=env, files=confined
                )
            except ConfigError as exc:
                return _unquoted([f"{exc.source}:{issue}" for issue in exc.issues], text, env)
            problems = validate(candidate, environ=env, config_dir=app.config_dir)
        return _unquoted(problems, text, env)

    def confined(candidate: GatewaySettings) -> list[ConfigIssue]:  # read no other file
        return outside_files(candidate, app.config, app.config_dir)

    env = app.environ  # what the running gateway was assembled with (the demo adds keys)
    control = AdminControl(
        runtime=app,
        readiness=Operations(app).readiness,
        reload=reload,
        drain=app.begin_drain,
        validate=check,
    )
    return create_admin_app(control)


def _unquoted(problems: list[str], text: str, environ: Mapping[str, str]) -> list[str]:
    """`problems` with the value of each variable `text` names (`${VAR}`) written as
    `${VAR}`: a candidate config comes from an admin client, and a problem that quotes
    an interpolated value (a path, a URL) would answer it a secret of the environment."""
    return unquoted(problems, text, environ)


def admin_server(app: GatewayApp) -> BesideServer:
    """The server of `app`'s admin API (`admin_app`), to run beside the public listener
    (`gateway.serving.run_beside`) on a socket the caller binds: `owngate serve` binds
    `admin.listen`, the demo a free loopback port. It has the public listener's limits,
    with at most `ADMIN_MAX_CONNECTIONS` connections (or `listen.max_connections` when
    lower): both count against one open-file limit. A connection past that cap drops one
    waiting for a request, as on the public listener (`gateway.listener_room`), so that
    connections held open without a request cannot keep operators out."""
    from gateway.listener_limits import ADMIN_MAX_CONNECTIONS
    from gateway.serving import BesideServer, uvicorn_config

    config = app.config
    cap = min(config.listen.max_connections or ADMIN_MAX_CONNECTIONS, ADMIN_MAX_CONNECTIONS)
    listen = config.listen.model_copy(update={"max_connections": cap})
    options = uvicorn_config(admin_app(app), listen, lifespan="on", timeout_graceful_shutdown=5)
    if config.admin.listen is not None:
        options.host = config.admin.listen.host
    return BesideServer(options)
