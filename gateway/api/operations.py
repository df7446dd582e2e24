"""The operations surface: `/healthz`, `/readyz`, `/metrics` and `/admin/status`.

`/healthz` says the process answers; `/readyz` whether it takes traffic (started, not
draining, the provenance log writable, under `serve --workers` its policy set not stale:
`TrustPolicies.stale`), with nothing more for probes and load balancers; `/metrics` the
Prometheus text (summed over the workers under `serve --workers`; by default,
`listen.metrics: admin`, for the admin surface's callers only). `/admin/status`
(admins only, api/admin.py) adds why: each backend, the policies, the log, the
witnesses, the shared state and the config reloads.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.api.admin import (
    ADMIN_ANSWER,
    authorize_metrics,
    backend_detail,
    send_status,
    status_report,
)
from gateway.api.runtime import Runtime
from gateway.asgi import Receive, Scope, Send, send_bytes, send_error, send_json
from gateway.errors import ErrorCode, GatewayError

__all__ = ["Operations"]

_PROMETHEUS: Final = b"text/plain; version=0.0.4; charset=utf-8"


class Operations:
    """The handlers of the operations paths, reading `runtime` on each request."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    async def healthz(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        await send_json(send, 200, {"status": "ok"}, request_id)

    async def readyz(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        """Readiness for probes and load balancers: the status and its code, nothing more
        (the detail names backends and the policy digest: `/admin/status` has it)."""
        ready = self.is_ready()
        status = {"status": "ready" if ready else "not ready"}
        await send_json(send, 200 if ready else 503, status, request_id)

    def is_ready(self) -> bool:
        runtime = self._runtime
        recorder = runtime.parts.recorder
        log_ok = recorder is None or not recorder.opened or recorder.log.last_error is None
        stale = runtime.parts.policies.stale  # a worker that could not read the policies
        stale |= runtime.reloader is not None and runtime.reloader.stale  # or its config
        stale |= runtime.parts.state.revocations_unknown is not None  # or its revoked keys
        return runtime.ready and not runtime.draining and log_ok and not stale

    def readiness(self) -> dict[str, Any]:
        """Why the gateway is ready or not: for admins (`/admin/status`, `readiness`)."""
        runtime = self._runtime
        parts = runtime.parts
        recorder = parts.recorder
        return {
            "status": "ready" if self.is_ready() else "not ready",
            "draining": runtime.draining,
            "backends": {
                b.id: backend_detail(parts.registry, parts.scraper, b)
                for b in parts.registry.backends.values()
            },
            "policy": {**parts.policies.status(), "stale": parts.policies.stale},
            "provenance": recorder.status() if recorder is not None and recorder.opened else "off",
            "witnesses": runtime.cosigning.status() if runtime.cosigning is not None else "off",
            "state": parts.state.status().detail(),
            "config": (
                {**runtime.reloader.status(), "stale": runtime.reloader.stale}
                if runtime.reloader is not None
                else "fixed"
            ),
            "worker": runtime.fleet.worker if runtime.fleet is not None else None,
        }

    async def admin_status(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes
    ) -> None:
        parts = self._runtime.parts

        def report() -> dict[str, Any]:
            status = status_report(parts.registry, parts.scraper, parts.proxy)
            return {**status, "readiness": self.readiness()}

        await send_status(scope, send, request_id, parts.config.admin, report)

    async def metrics(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        """The Prometheus text: with `listen.metrics: admin` (the default), for the admin
        surface's callers only, or loopback clients when no admin token is configured (its
        rule ids name each tenant's policy and data classes, its counts when each sends
        what: docs/security.md); with `open`, for anyone."""
        runtime = self._runtime
        config = runtime.parts.config
        if config.listen.metrics == "admin":
            try:
                if scope["method"] not in ("GET", "HEAD"):
                    raise GatewayError(ErrorCode.method_not_allowed, "/metrics accepts only GET")
                authorize_metrics(scope, config.admin)
            except GatewayError as error:
                await send_error(send, error, request_id)
                return
        fleet = runtime.fleet
        body = runtime.metrics.render() if fleet is None else fleet.render(runtime.metrics)
        # never stored: under `admin` an admin's answer (gateway/api/admin.py ADMIN_ANSWER)
        await send_bytes(send, 200, body, request_id, _PROMETHEUS, ADMIN_ANSWER)
