"""`GatewayApp`: the gateway as a plain ASGI application (build it with
`gateway.app.create_app`).

No web framework on the hot path: a dict maps paths to handlers (the tenant surface in
api/openai.py, the operations surface in api/operations.py), the body is read once, and
errors become OpenAI error objects in one place (`send_error`). This module owns what
spans requests: the lifespan (the provenance log, shared state, health probes,
policy watchers and, when on, the trace exporter start and stop with it), installing a
new assembly on a config reload, SIGHUP, and the drain on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.api.exchange import cancel
from gateway.api.labels import excerpt
from gateway.api.openai import PROXIED, TenantSurface, new_request_id
from gateway.api.operations import Operations
from gateway.api.parts import Assembly
from gateway.api.runtime import Runtime
from gateway.api.tenant_auth import TenantAuth
from gateway.api.tenant_reads import TenantReads
from gateway.asgi import Receive, Scope, Send, lifespan, send_error
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import get_logger
from gateway.provenance import ProvenanceError
from gateway.provenance.witness.client import WitnessClient
from gateway.provenance.writer.cosignature_collector import Cosigning
from gateway.tracing import start_tracing
from gateway.upstream.litellm_runtime import preload_litellm
from gateway.upstream.sockets import share_with_hosted

__all__ = ["GatewayApp"]

Handler = Callable[[Scope, Receive, Send, bytes], Awaitable[None]]

TRACE_FLUSH_S = 5.0  # at shutdown, how long queued spans may take to export


class GatewayApp(Runtime):
    """The ASGI callable: dispatch, lifespan, config reloads and the drain."""

    def __init__(self, parts: Assembly, config_dir: Path) -> None:
        super().__init__(parts, config_dir)
        self._peers: Mapping[str, int] = {}  # other replicas' in-flight, per backend
        self._background: list[asyncio.Task[None]] = []
        self._watchers: list[asyncio.Task[None]] = []
        # Why the lifespan shutdown failed (the final checkpoint), for `owngate serve`'s exit.
        self.shutdown_error: str | None = None
        self.install(parts)
        # Shared state outlives config reloads (its own settings apply on restart).
        self.state.watch_peers(self._peers_changed)
        self.metrics.watch_state(self.state, lambda: self.parts.registry)
        if parts.recorder is not None:  # like the metrics, it outlives config reloads
            self.metrics.watch_provenance(parts.recorder)
        auth = TenantAuth(self)
        tenant, operations = TenantSurface(self, auth), Operations(self)
        self._proxied = tenant.proxied
        reads = TenantReads(self, auth.authenticate)
        self._provenance = reads.provenance
        self._routes: dict[str, Handler] = {
            "/healthz": operations.healthz,
            "/readyz": operations.readyz,
            "/metrics": operations.metrics,
            "/v1/models": reads.models,
            "/admin/status": operations.admin_status,
        }

    def install(self, parts: Assembly) -> set[asyncio.Task[Any]]:
        """Make `parts` active: one reference swap; requests already dispatching keep the
        parts they were decided with (returned: the requests running now). Running watchers
        (health probes, policy files) move to the new parts."""
        running = set(self.serving)
        if self.parts.policies is not parts.policies:  # requests still running: see Proxy
            self.parts.policies.successor = parts.policies
        if self.parts.registry is not parts.registry:  # theirs too (`Registry.moved`)
            self.parts.registry.successor = parts.registry
        self.parts = parts
        # Hosted providers' connectors made from now on join the active registry's share
        # (LiteLLM's), and hosted connections open within its connect timeout: here, not
        # in `Registry.build`, which validating a candidate runs too.
        share_with_hosted(parts.registry.sockets, parts.config.limits.connect_timeout_s)
        parts.registry.set_peer_inflight(self._peers)
        parts.metrics.watch_policies(parts.policies)
        parts.metrics.watch_backends(parts.registry, parts.scraper)
        if self._watchers:
            for task in self._start_watchers():
                task.cancel()
        return running

    def _start_watchers(self) -> list[asyncio.Task[None]]:
        """Start probing the active backends and polling the active policy files; returns
        the watchers of the previous assembly."""
        previous = self._watchers
        self._watchers = [
            asyncio.create_task(self.parts.scraper.run()),
            asyncio.create_task(self.parts.policies.watch()),
        ]
        return previous

    def _peers_changed(self, others: Mapping[str, int]) -> None:
        """After a shared-state sync: routing counts the other replicas' requests too."""
        self._peers = others
        self.parts.registry.set_peer_inflight(others)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            proxied = PROXIED.get(path)
            if proxied is not None:
                await self._proxied(scope, receive, send, proxied[0], proxied[1])
                return
            request_id = new_request_id()
            handler = self._routes.get(path)
            if handler is None and path.startswith("/v1/provenance/"):
                handler = self._provenance
            if handler is None:
                error = GatewayError(ErrorCode.not_found, f"Unknown path `{excerpt(path)}`.")
                await send_error(send, error, request_id)
                return
            await handler(scope, receive, send, request_id)
        elif kind == "lifespan":
            await lifespan(receive, send, self._startup, self._shutdown)

    async def _startup(self) -> str | None:
        if self.parts.tracing is not None and self.tracer is None:
            self.tracer = start_tracing(self.parts.tracing)  # loads the SDK: tracing is on
        recorder = self.parts.recorder
        if recorder is not None:
            try:
                await recorder.open()
            except (OSError, ProvenanceError) as exc:
                return f"provenance log: {exc}"  # fail closed: no log, no traffic
        if self.policies.current.falls_back():  # before traffic: beside it, the GIL
            await preload_litellm()  # it holds stalls every request (litellm_runtime.py)
        await self.state.start()  # never fails: Redis down means local state
        # Know which backends are healthy before taking traffic (bounded by the scrape
        # timeout), then keep probing in the background.
        await self.parts.scraper.scrape_once()
        self._start_watchers()
        if self.reloader is not None:
            self._background.append(asyncio.create_task(self.reloader.watch()))
        if self.fleet is not None:
            self._background.append(asyncio.create_task(self.fleet.publish(self.metrics)))
        self._start_cosigning()
        _reload_on_sighup(self.reload)
        self.ready = not self.draining  # a SIGTERM during startup stands
        return None

    async def _shutdown(self) -> str | None:
        self.ready = False
        tasks = [*self._background, *self._watchers]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.fleet is not None:
            self.fleet.write(self.metrics)  # the final counts outlive this worker
        await self.parts.proxy.close()
        await self.parts.registry.close()
        try:
            await self._close_log()
        finally:
            await self.state.close()  # whatever became of the log
            await self._flush_traces()
        return self.shutdown_error

    async def _flush_traces(self) -> None:
        """Export the spans still queued, bounded by `TRACE_FLUSH_S`: a collector that
        does not answer delays shutdown by that much at most."""
        tracer, self.tracer = self.tracer, None
        if tracer is not None and not await tracer.shutdown(TRACE_FLUSH_S):
            get_logger("owngate").warning("traces not flushed", timeout_s=TRACE_FLUSH_S)

    def _start_cosigning(self) -> None:
        """Ask the configured witnesses to cosign each new checkpoint, in the background:
        a witness that is down is retried and reported, never waited for by requests."""
        settings = self.config.provenance
        recorder = self.parts.recorder
        if settings is None or not settings.witnesses or recorder is None:
            return
        self.cosigning = Cosigning(
            recorder.log,
            self.config_dir / settings.dir,
            [WitnessClient(w.url, w.vkey, timeout=w.timeout_s) for w in settings.witnesses],
            retry_max_s=settings.witness_retry_max_s,
            events=get_logger("owngate.provenance"),
        )
        self.metrics.watch_cosigning(self.cosigning)
        self._background.append(asyncio.create_task(self.cosigning.run()))

    async def _close_log(self) -> None:
        """Write what is queued and sign a final checkpoint. If that fails (a full disk),
        the failure is logged and kept in `shutdown_error` (`owngate serve` then exits 4):
        the entries since the last checkpoint stay in the write-ahead segment, and the next
        start recovers and signs them once the disk takes writes."""
        recorder = self.parts.recorder
        if recorder is None:
            return
        try:
            await recorder.close()
        except (OSError, ProvenanceError) as exc:
            self.shutdown_error = f"provenance log: the final checkpoint was not signed: {exc}"
            get_logger("owngate").error(
                "final checkpoint not signed", reason=type(exc).__name__, detail=str(exc)
            )

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
        self.cutting = True
        for task in list(self.serving):
            cancel(task)  # a charge being made is made first (`settle`)

    def reload(self) -> None:
        """SIGHUP: reload gateway.yaml (when served from a file) and the trust policies."""
        if self.reloader is None:
            self.policies.reload()
            return
        self.reloader.trigger()


def _reload_on_sighup(reload: Callable[[], None]) -> None:
    """SIGHUP reloads config and policies (only where this loop owns signals: the main
    thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGHUP, reload)
