"""`gateway.yaml`'s `routing:` section: how the eligible backends of a request are ordered
(pools, scorer weights, wait queues), the circuit breaker and failover."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.config.base import _Strict

__all__ = [
    "BreakerSettings",
    "FailoverSettings",
    "PoolSettings",
    "QueueSettings",
    "RoutingSettings",
    "WeightSettings",
]


class WeightSettings(_Strict):
    """Scorer weights of the `score` strategy (see gateway/routing/picker.py)."""

    queue: float = Field(default=1.0, ge=0)
    kv: float = Field(default=0.3, ge=0)
    affinity: float = Field(default=0.5, ge=0)
    prefill: float = Field(default=1.0, ge=0)


class QueueSettings(_Strict):
    """The gateway's bounded wait queue of one pool when every private backend is saturated
    (waiting requests per slot above `threshold`) and the policy allows no fallback."""

    threshold: float = Field(default=1.0, gt=0, description="waiting requests per slot")
    size: int = Field(default=256, ge=0, description="waiters at most; 0 turns the queue off")
    size_per_tenant: int | None = Field(
        default=None,
        gt=0,
        description="waiters of one tenant at most (with several tenants); default half "
        "of size (at least 1)",
    )
    max_wait_s: float = Field(default=30.0, gt=0)

    @property
    def tenant_size(self) -> int:
        """How many of `size` one tenant's requests may take: the setting, else half
        (at least one), so that one tenant's waiters leave the other tenants room."""
        if self.size_per_tenant is not None:
            return min(self.size_per_tenant, self.size)
        return max(self.size // 2, 1)


class PoolSettings(_Strict):
    strategy: Literal["score", "least_inflight", "round_robin"] = "score"
    weights: WeightSettings = WeightSettings()
    queue: QueueSettings = QueueSettings()


class BreakerSettings(_Strict):
    """The circuit breaker of a backend (gateway/routing/breaker.py)."""

    failure_threshold: int = Field(default=3, gt=0, description="consecutive failures to open")
    cooldown_s: float = Field(default=1.0, gt=0, description="first open period")
    max_cooldown_s: float = Field(default=30.0, gt=0, description="cap of the doubling")

    @model_validator(mode="after")
    def _cap_covers_cooldown(self) -> BreakerSettings:
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError("max_cooldown_s must be at least cooldown_s")
        return self


class FailoverSettings(_Strict):
    """Retries on the next eligible backend, before the client has seen a byte."""

    max_attempts: int = Field(default=3, gt=0, description="private attempts per request")
    deadline_s: float = Field(
        default=300.0, gt=0, description="from arrival to the first byte, all attempts together"
    )


class RoutingSettings(_Strict):
    """How the eligible backends of a request are ordered: a default and per-model pools."""

    default: PoolSettings = PoolSettings()
    pools: dict[str, PoolSettings] = Field(default_factory=dict)
    affinity_prefix_bytes: int = Field(default=4096, ge=64)
    breaker: BreakerSettings = BreakerSettings()
    failover: FailoverSettings = FailoverSettings()
