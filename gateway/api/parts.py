"""`Assembly`: the parts of a gateway built from one config, as the HTTP surface uses them.

`gateway.app.assemble` (the composition root) builds it; `GatewayApp.install` makes it
active. A config reload builds a new one and swaps it in whole: a request is decided and
routed by the parts active once its body is read, and keeps them. The metrics, the
shared state and the recorder live as long as the process: a reload passes them on
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

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

__all__ = ["Assembly", "RequestLimits"]


class RequestLimits(NamedTuple):
    """The `limits` (and whether the access line is written) every proxied request reads,
    copied once per config: a pydantic model's attribute is no specialized load (its
    class has a `__getattr__`), ~15 times a plain read's cost, and the per-tenant parts
    are properties computed on each read."""

    max_body_bytes: int
    max_held_body_bytes: int
    tenant_held_body_bytes: int
    max_held_answer_bytes: int
    tenant_held_answer_bytes: int
    access_log: bool


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
    limits: RequestLimits = field(init=False)

    def __post_init__(self) -> None:
        limits = self.config.limits
        copied = RequestLimits(
            limits.max_body_bytes,
            limits.max_held_body_bytes,
            limits.tenant_held_body_bytes,
            limits.max_held_answer_bytes,
            limits.tenant_held_answer_bytes,
            self.config.logging.access_log,
        )
        object.__setattr__(self, "limits", copied)  # frozen: set once, here
