"""`create_app(config)`: the gateway as a plain ASGI application.

No web framework on the hot path: a dict maps paths to handlers, the body is read once,
and errors become OpenAI error objects in one place (`send_error`). Resources (backend
connection pools) open and close with the ASGI lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.api.admin import backend_detail, send_status, status_report
from gateway.api.asgi import (
    Receive,
    Scope,
    Send,
    header_values,
    send_bytes,
    send_error,
    send_json,
)
from gateway.api.body import read_body
from gateway.api.exchange import (
    Exchange,
    end_stream,
    receipt_headers,
    send_error_event,
)
from gateway.api.fleet import FleetMetrics
from gateway.api.labels import excerpt
from gateway.api.metrics import GatewayMetrics
from gateway.api.proxy import Proxy
from gateway.api.recorder import Recorder
from gateway.api.reload import Assembly, ConfigReloader, keep_unchanged_backends
from gateway.assembly import build_routing
from gateway.config.schema import GatewayConfig
from gateway.config.schema import State as StateSettings
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import get_logger
from gateway.policy_set import TrustPolicies
from gateway.provenance import ProvenanceError
from gateway.provenance.witness.client import WitnessClient
from gateway.provenance.writer.cosignature_collector import Cosigning
from gateway.routing.registry import Registry, TenantEntry
from gateway.routing.scraper import MetricsScraper
from gateway.state import Admission, RateLimited, SharedState, create_state

__all__ = ["GatewayApp", "create_app"]

Handler = Callable[[Scope, Receive, Send, bytes], Awaitable[None]]

_PROXIED = {
    "/v1/chat/completions": ("chat", b"/v1/chat/completions"),
    "/v1/completions": ("completions", b"/v1/completions"),
    "/v1/embeddings": ("embeddings", b"/v1/embeddings"),
}
_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"


class GatewayApp:
    """The ASGI callable. Build it with `create_app`."""

    # Built from the config by `assemble`; a config reload swaps them (`install`).
    config: GatewayConfig
    registry: Registry
    trust: TrustPolicies
    scraper: MetricsScraper
    proxy: Proxy

    def __init__(
        self,
        config: GatewayConfig,
        *,
        environ: dict[str, str] | None = None,
        config_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = GatewayMetrics()
        self._clock = clock  # backend health and breakers (tests inject a fake one)
        self._env = dict(os.environ if environ is None else environ)
        self._config_dir = config_dir or Path.cwd()
        self._assembled = False
        # Shared state outlives config reloads (its own settings apply on restart).
        self.state: SharedState = _shared_state(config.state)
        self._peers: Mapping[str, int] = {}  # other replicas' in-flight, per backend
        self.state.watch_peers(self._peers_changed)
        # Raises AssemblyError: without valid policies (and keys) the gateway does not start.
        self.install(self.assemble(config))
        self.metrics.watch_state(self.state, lambda: self.registry)
        self._background: list[asyncio.Task[None]] = []
        self._watchers: list[asyncio.Task[None]] = []
        self.ready = False
        self.draining = False
        self._cutting = False
        self.serving: set[asyncio.Task[Any]] = set()  # the tasks of proxied requests
        self.reloader: ConfigReloader | None = None  # set by `owngate serve` (a config file)
        self.fleet: FleetMetrics | None = None  # set by `serve --workers`: /metrics sums them
        self.cosigning: Cosigning | None = None  # witnesses asked to cosign checkpoints
        # Why the lifespan shutdown failed (the final checkpoint), for `owngate serve`'s exit.
        self.shutdown_error: str | None = None
        self._log = get_logger("owngate.access")
        self._routes: dict[str, Handler] = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
            "/v1/models": self._models,
            "/admin/status": self._admin_status,
        }

    def assemble(self, config: GatewayConfig) -> Assembly:
        """Everything built from the config: on startup, and again on each config reload.

        Raises AssemblyError (a ValueError) naming every problem only checkable here:
        policies invalid for these backends, backend keys missing from the environment."""
        registry, trust = build_routing(
            config, environ=self._env, config_dir=self._config_dir, clock=self._clock
        )
        if self._assembled:  # a reload: unchanged backends keep pools and counts
            keep_unchanged_backends(registry, self.registry, config.limits == self.config.limits)
        scraper = MetricsScraper(
            registry.backends.values(),
            config.scrape,
            clock=self._clock,
            health=config.health,
            last_up=registry.last_up,
        )
        proxy = Proxy(
            registry,
            self.metrics,
            trust,
            scraper,
            environ=self._env,
            hosted_timeout_s=config.limits.first_byte_timeout_s,
            routing=config.routing,
            state=self.state,
            max_response_bytes=config.limits.max_response_bytes,
            response_timeout_s=config.limits.response_timeout_s,
        )
        return Assembly(config, registry, trust, scraper, proxy)

    def install(self, parts: Assembly) -> None:
        """Make `parts` active: one reference swap each; requests already running keep
        the objects they started with."""
        if self._assembled:
            parts.proxy.recorder = self.proxy.recorder  # one log for the process's life
        self._assembled = True
        self.config = parts.config
        self.registry = parts.registry
        self.registry.set_peer_inflight(self._peers)
        self.trust = parts.trust
        self.scraper = parts.scraper
        self.proxy = parts.proxy
        self._access_log = parts.config.logging.access_log
        self._max_body = parts.config.limits.max_body_bytes
        self.metrics.watch_policies(self.trust)
        self.metrics.watch_backends(self.registry, self.scraper)

    def _start_cosigning(self) -> None:
        """Ask the configured witnesses to cosign each new checkpoint, in the background:
        a witness that is down is retried and reported, never waited for by requests."""
        settings = self.config.provenance
        if settings is None or not settings.witnesses or self.proxy.recorder is None:
            return
        self.cosigning = Cosigning(
            self.proxy.recorder.log,
            self._config_dir / settings.dir,
            [WitnessClient(w.url, w.vkey, timeout=w.timeout_s) for w in settings.witnesses],
            retry_max_s=settings.witness_retry_max_s,
            events=get_logger("owngate.provenance"),
        )
        self.metrics.watch_cosigning(self.cosigning)
        self._background.append(asyncio.create_task(self.cosigning.run()))

    def _peers_changed(self, others: Mapping[str, int]) -> None:
        """After a shared-state sync: routing counts the other replicas' requests too."""
        self._peers = others
        self.registry.set_peer_inflight(others)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            proxied = _PROXIED.get(path)
            if proxied is not None:
                await self._openai(scope, receive, send, proxied[0], proxied[1])
                return
            request_id = _new_request_id()
            handler = self._routes.get(path)
            if handler is None and path.startswith("/v1/provenance/"):
                handler = self._provenance
            if handler is None:
                error = GatewayError(ErrorCode.not_found, f"Unknown path `{excerpt(path)}`.")
                await send_error(send, error, request_id)
                return
            await handler(scope, receive, send, request_id)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.config.provenance is not None:
                    try:
                        self.proxy.recorder = await Recorder.open(
                            self.config.provenance, self._config_dir
                        )
                    except (OSError, ProvenanceError) as exc:
                        # Fail closed: no log, no traffic.
                        await send(
                            {"type": "lifespan.startup.failed", "message": f"provenance log: {exc}"}
                        )
                        return
                await self.state.start()  # never fails: Redis down means local state
                # Know which backends are healthy before taking traffic (bounded by the
                # scrape timeout), then keep probing in the background.
                await self.scraper.scrape_once()
                self.start_watchers()
                if self.reloader is not None:
                    self._background.append(asyncio.create_task(self.reloader.watch()))
                if self.fleet is not None:
                    self._background.append(asyncio.create_task(self.fleet.publish(self.metrics)))
                self._start_cosigning()
                _reload_on_sighup(self.reload)
                self.ready = not self.draining  # a SIGTERM during startup stands
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.ready = False
                tasks = [*self._background, *self._watchers]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if self.fleet is not None:
                    self.fleet.write(self.metrics)  # the final counts outlive this worker
                await self.proxy.close()
                await self.registry.close()
                try:
                    await self._close_log()
                finally:
                    await self.state.close()  # whatever became of the log
                if self.shutdown_error is not None:
                    await send({"type": "lifespan.shutdown.failed", "message": self.shutdown_error})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                return

    async def _close_log(self) -> None:
        """Write what is queued and sign a final checkpoint. If that fails (a full disk),
        the failure is logged and kept in `shutdown_error` (`owngate serve` then exits 4):
        the entries since the last checkpoint stay in the write-ahead segment, and the next
        start recovers and signs them once the disk takes writes."""
        recorder = self.proxy.recorder
        if recorder is None:
            return
        try:
            await recorder.close()
        except (OSError, ProvenanceError) as exc:
            self.shutdown_error = f"provenance log: the final checkpoint was not signed: {exc}"
            get_logger("owngate").error(
                "final checkpoint not signed", reason=type(exc).__name__, detail=str(exc)
            )

    # the OpenAI surface

    async def _openai(
        self, scope: Scope, receive: Receive, send: Send, endpoint: str, upstream_path: bytes
    ) -> None:
        exchange = Exchange(_new_request_id(), time.perf_counter(), endpoint)
        try:
            if scope["method"] != "POST":
                raise GatewayError(ErrorCode.method_not_allowed, f"{endpoint} accepts only POST")
            if not self.ready:
                raise GatewayError(ErrorCode.not_ready, "the gateway is not ready")
            self.serving.add(asyncio.current_task())  # type: ignore[arg-type]
            tenant = self._authenticate(scope)
            exchange.tenant = tenant.id
            admission = await self._admit(tenant)
            exchange.charge = lambda: admission.release(_tokens_used(exchange))
            try:
                body = await read_body(scope, receive, self._max_body)
                await self.proxy.forward(
                    exchange, tenant, scope, body, upstream_path, receive, send
                )
            finally:
                # The answer is over: a drain deadline from now on must not cut (and write
                # to) a finished response, nor interrupt the release.
                self.serving.discard(asyncio.current_task())
                await admission.release(_tokens_used(exchange))
        except GatewayError as error:
            exchange.status = error.status
            if not exchange.response_started:
                # The prompt may have left (and been logged): the receipt says where.
                headers = await receipt_headers(exchange)
                await send_error(send, error, exchange.request_id, headers)
        except asyncio.CancelledError:
            if not self._cutting:
                raise
            await self._cut(exchange, send)
        except Exception:  # noqa: BLE001 - last resort: logged, answered 500, never passed on
            exchange.status = 500
            self._log.exception("unhandled error", request_id=exchange.request_id.decode())
            if not exchange.response_started:
                internal = GatewayError(ErrorCode.internal_error, "internal gateway error")
                await send_error(send, internal, exchange.request_id)
        finally:
            self.serving.discard(asyncio.current_task())
            self._finish(exchange)

    async def _cut(self, exchange: Exchange, send: Send) -> None:
        """The drain deadline passed with this request still running: end it cleanly (a
        stream gets an error event, its receipt and a proper end; others a 503)."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        error = GatewayError(
            ErrorCode.not_ready, "the gateway is shutting down and its drain deadline passed"
        )
        exchange.status = error.status
        if not exchange.response_started:
            await send_error(send, error, exchange.request_id, await receipt_headers(exchange))
            return
        if exchange.stream:
            await send_error_event(send, error)
            await end_stream(send, exchange)
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def begin_drain(self) -> None:
        """Shutdown began (SIGTERM): new requests get 503 not_ready and /readyz says
        draining; what still runs after `limits.drain_timeout_s` is cut cleanly."""
        if self.draining:
            return
        self.draining = True
        self.ready = False
        timeout = self.config.limits.drain_timeout_s
        get_logger("owngate").info("draining", requests=len(self.serving), timeout_s=timeout)
        self._background.append(asyncio.create_task(self._cut_after(timeout)))

    async def drained(self, margin_s: float = 5.0) -> None:
        """Return once no proxied request runs: they finished, or the drain deadline cut
        them (bounded by the deadline plus `margin_s`, whatever a request does)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.config.limits.drain_timeout_s + margin_s
        while self.serving and loop.time() < give_up:  # noqa: ASYNC110 - once, at shutdown
            await asyncio.sleep(0.05)

    async def _cut_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if self.serving:
            get_logger("owngate").warning("drain deadline passed", cut=len(self.serving))
        self._cutting = True
        for task in list(self.serving):
            task.cancel()

    def reload(self) -> None:
        """SIGHUP: reload gateway.yaml (when served from a file) and the trust policies."""
        if self.reloader is None:
            self.trust.reload()
            return
        self.reloader.trigger()

    def start_watchers(self) -> list[asyncio.Task[None]]:
        """Start probing the active backends and polling the active policy files; returns
        the watchers of the previous assembly (a config reload stops them)."""
        previous = self._watchers
        self._watchers = [
            asyncio.create_task(self.scraper.run()),
            asyncio.create_task(self.trust.watch()),
        ]
        return previous

    def _finish(self, exchange: Exchange) -> None:
        elapsed = time.perf_counter() - exchange.started_at
        self.metrics.observe_request(exchange.endpoint, exchange.status, exchange.backend, elapsed)
        if self._access_log:
            self._log.info(
                "request",
                request_id=exchange.request_id.decode(),
                endpoint=exchange.endpoint,
                tenant=exchange.tenant,
                model=exchange.model,
                data_class=exchange.data_class,
                data_class_defaulted=exchange.data_class_defaulted,
                policy=exchange.policy,
                backend=exchange.backend,
                fallback=exchange.fallback,
                status=exchange.status,
                stream=exchange.stream,
                upstream_error=exchange.upstream_error,
                duration_ms=round(elapsed * 1000, 3),
            )

    async def _admit(self, tenant: TenantEntry) -> Admission:
        """The tenant's rate limits (per process, or across replicas with Redis)."""
        try:
            return await self.state.acquire(tenant.id, tenant.limits)
        except RateLimited as exc:
            raise GatewayError(
                ErrorCode.rate_limit_exceeded,
                exc.message,
                headers=((b"retry-after", exc.retry_after_header),),
            ) from exc

    def _authenticate(self, scope: Scope) -> TenantEntry:
        values = header_values(scope, b"authorization")
        if not values:
            raise GatewayError(
                ErrorCode.missing_api_key,
                "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
            )
        if len(values) > 1:  # which copy a proxy in front read is unknowable: none counts
            raise GatewayError(
                ErrorCode.invalid_api_key, "Send one Authorization header, not several."
            )
        value = values[0]
        scheme, _, key = value.partition(b" ")
        key = key.strip()
        if scheme.lower() != b"bearer" or not key:
            raise GatewayError(
                ErrorCode.invalid_api_key, "Malformed Authorization header; use 'Bearer KEY'."
            )
        digest = "sha256:" + hashlib.sha256(key).hexdigest()
        tenant = self.registry.tenants_by_key.get(digest)
        if tenant is None or self.state.is_revoked(digest):
            raise GatewayError(ErrorCode.invalid_api_key, "Incorrect API key provided.")
        return tenant

    async def _models(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        try:
            if scope["method"] != "GET":
                raise GatewayError(ErrorCode.method_not_allowed, "/v1/models accepts only GET")
            tenant = self._authenticate(scope)
        except GatewayError as error:
            await send_error(send, error, request_id)
            return
        policy = self.trust.current
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": self.registry.owners[name]}
            for name in self.registry.models_for(tenant)
            if policy.decide(tenant.id, name, None).refusal is None
        ]
        await send_json(send, 200, {"object": "list", "data": data}, request_id)

    # operations

    async def _healthz(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        await send_json(send, 200, {"status": "ok"}, request_id)

    async def _readyz(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        """Readiness for probes and load balancers: the status and its code, nothing more
        (the detail names backends and the policy digest: `/admin/status` has it)."""
        ready = self._is_ready()
        status = {"status": "ready" if ready else "not ready"}
        await send_json(send, 200 if ready else 503, status, request_id)

    def _is_ready(self) -> bool:
        recorder = self.proxy.recorder
        log_ok = recorder is None or recorder.log.last_error is None
        return self.ready and not self.draining and log_ok

    def _readiness(self) -> dict[str, Any]:
        """Why the gateway is ready or not: for admins (`/admin/status`, `readiness`)."""
        recorder = self.proxy.recorder
        return {
            "status": "ready" if self._is_ready() else "not ready",
            "draining": self.draining,
            "backends": {
                b.id: backend_detail(self.registry, self.scraper, b)
                for b in self.registry.backends.values()
            },
            "policy": self.trust.status(),
            "provenance": recorder.status() if recorder is not None else "off",
            "witnesses": self.cosigning.status() if self.cosigning is not None else "off",
            "state": self.state.status().detail(),
            "config": self.reloader.status() if self.reloader is not None else "fixed",
            "worker": self.fleet.worker if self.fleet is not None else None,
        }

    async def _provenance(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes
    ) -> None:
        """`GET /v1/provenance/receipts/{id}` and `/proofs/{id}`, for the tenant that sent it."""
        try:
            if scope["method"] != "GET":
                raise GatewayError(ErrorCode.method_not_allowed, "provenance paths accept GET")
            tenant = self._authenticate(scope)
            _, _, rest = scope["path"].partition("/v1/provenance/")
            kind, _, wanted = rest.partition("/")
            recorder = self.proxy.recorder
            found = recorder.receipt(wanted, tenant.id) if recorder is not None else None
            if kind not in ("receipts", "proofs") or recorder is None or found is None:
                raise GatewayError(
                    ErrorCode.not_found, "no receipt for that request id (or not yours)"
                )
            sealing, index = found
            if kind == "receipts":
                try:
                    envelope = await asyncio.shield(sealing)
                except Exception as exc:  # Recorder._sealed logged the cause
                    raise GatewayError(
                        ErrorCode.provenance_unavailable, "the receipt could not be signed"
                    ) from exc
                await send_bytes(send, 200, envelope, request_id, b"application/json")
                return
            try:
                proof = await recorder.log.inclusion_proof(index)
            except ValueError as exc:
                raise GatewayError(
                    ErrorCode.not_found,
                    "the request is logged but no signed checkpoint covers it yet; retry "
                    "in a second",
                ) from exc
            await send_bytes(send, 200, proof.format().encode(), request_id, b"text/plain")
        except GatewayError as error:
            await send_error(send, error, request_id)

    async def _admin_status(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes
    ) -> None:
        def report() -> dict[str, Any]:
            status = status_report(self.registry, self.scraper, self.proxy)
            return {**status, "readiness": self._readiness()}

        await send_status(scope, send, request_id, self.config.admin, report)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        body = self.metrics.render() if self.fleet is None else self.fleet.render(self.metrics)
        await send_bytes(send, 200, body, request_id, _PROMETHEUS)


def _reload_on_sighup(reload: Callable[[], None]) -> None:
    """SIGHUP reloads config and policies (only where this loop owns signals: the main
    thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGHUP, reload)


def _shared_state(settings: StateSettings) -> SharedState:
    return create_state(
        settings.backend,
        settings.url,
        replica_id=settings.replica_id,
        key_prefix=settings.key_prefix,
        timeout_s=settings.timeout_ms / 1000,
        sync_interval_s=settings.sync_interval_s,
        lease_ttl_s=settings.lease_ttl_s,
        max_connections=settings.max_connections,
    )


def _tokens_used(exchange: Exchange) -> int:
    """Tokens to charge to the tenant's per-minute budget: the answer's usage, or an
    estimate when the backend reported none (`Trail.charged_tokens`)."""
    return 0 if exchange.trail is None else exchange.trail.charged_tokens()


def _new_request_id() -> bytes:
    return b"req_" + os.urandom(12).hex().encode()


def create_app(
    config: GatewayConfig,
    *,
    environ: dict[str, str] | None = None,
    config_dir: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> GatewayApp:
    """Build the gateway ASGI app from a validated config.

    `config_dir` anchors relative paths in the config (policy files); `environ` supplies
    `${...}`-free secrets such as backend keys (defaults to the process environment);
    `clock` is what backend health, breakers and scrape ages read (monotonic seconds).
    """
    return GatewayApp(config, environ=environ, config_dir=config_dir, clock=clock)
