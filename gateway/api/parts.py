"""`Assembly`: the parts of a gateway built from one config, as the HTTP surface uses them.

`gateway.app.assemble` (the composition root) builds it; `GatewayApp.install` makes it
active. A config reload builds a new one and swaps it in whole: a request is decided and
routed by the parts active once its body is read, and keeps them. The metrics, the
shared state and the recorder live as long as the process: a reload passes them on
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.api.metrics import GatewayMetrics
    from gateway.api.proxy import Proxy
    from gateway.api.recorder import Recorder
    from gateway.config.schema import GatewaySettings
    from gateway.policy_set import TrustPolicies
    from gateway.routing.registry import Registry
    from gateway.routing.scraper import MetricsScraper
    from gateway.state import SharedState
    from gateway.tenants import TenantEntry
    from gateway.tracing import TracingSettings

__all__ = ["Assembly"]


@dataclass(frozen=True, slots=True)
class Assembly:
    """Everything the request path needs, built from `config`."""

    config: GatewaySettings
    registry: Registry  # backends and the models they serve
    tenants: dict[str, TenantEntry]  # tenant API key digest -> tenant
    policies: TrustPolicies  # the trust policies, reloaded when their files change
    scraper: MetricsScraper  # backend load and health probes
    proxy: Proxy  # decides, plans and relays one proxied request
    metrics: GatewayMetrics
    state: SharedState  # rate limits, revocations, other replicas' load
    recorder: Recorder | None  # the provenance log's writer; None without `provenance`
    # OpenTelemetry traces as the OTEL_* variables configure them; None: off. Like the
    # recorder, read once per process (the app's lifespan starts the SDK).
    tracing: TracingSettings | None = None
