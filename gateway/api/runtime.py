"""`Runtime`: the running gateway as its HTTP handlers read it.

The active `Assembly` (a config reload swaps it whole), whether the gateway takes
traffic (`ready`, `draining`), the proxied requests being served (what a drain waits
for and its deadline cuts), and the parts only `owngate serve` adds: the config
reloader, the workers' shared metrics, the witness cosigning. `GatewayApp` is a
`Runtime` that also answers ASGI; the handlers (api/openai.py, api/operations.py) hold
the runtime, never the app, so nothing in `api/` refers back to the app.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.api.parts import Assembly
from gateway.body_budget import BodyBudget

if TYPE_CHECKING:
    from gateway.api.fleet import FleetMetrics
    from gateway.api.metrics import GatewayMetrics
    from gateway.api.proxy import Proxy
    from gateway.api.reload import ConfigReloader
    from gateway.config.schema import GatewaySettings
    from gateway.policy_set import TrustPolicies
    from gateway.provenance.writer.cosignature_collector import Cosigning
    from gateway.routing.registry import Registry
    from gateway.state import SharedState
    from gateway.tracing.spans import RequestTracer

__all__ = ["Runtime"]


class Runtime:
    """The gateway's state while it runs (see the module docstring)."""

    def __init__(self, parts: Assembly, config_dir: Path) -> None:
        self.parts = parts
        self.config_dir = config_dir  # anchors the config's relative paths
        # The environment the parts were assembled with (backend keys; `create_app` sets
        # it): a reload and the admin API's config validation read the same.
        self.environ: Mapping[str, str] = {}
        self.ready = False  # startup complete and not draining: proxied requests are taken
        self.draining = False  # shutdown began (SIGTERM)
        self.cutting = False  # the drain deadline passed: what still runs is being cut
        self.serving: set[asyncio.Task[Any]] = set()  # the tasks of proxied requests
        self.bodies = BodyBudget()  # request bodies held now (limits.max_held_body_bytes)
        self.answers = BodyBudget()  # whole answers held now (limits.max_held_answer_bytes)
        self.reloader: ConfigReloader | None = None  # a config served from a file
        self.fleet: FleetMetrics | None = None  # `serve --workers`: /metrics sums them
        self.cosigning: Cosigning | None = None  # witnesses asked to cosign checkpoints
        # Starts the spans of proxied requests; None: tracing off (gateway/tracing).
        self.tracer: RequestTracer | None = None

    # The active parts, by name (handlers on the request path read `parts` once).

    @property
    def config(self) -> GatewaySettings:
        return self.parts.config

    @property
    def registry(self) -> Registry:
        return self.parts.registry

    @property
    def policies(self) -> TrustPolicies:
        return self.parts.policies

    @property
    def proxy(self) -> Proxy:
        return self.parts.proxy

    @property
    def state(self) -> SharedState:
        return self.parts.state

    @property
    def metrics(self) -> GatewayMetrics:
        return self.parts.metrics
