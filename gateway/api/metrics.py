"""The gateway's own Prometheus metrics, on a registry owned by one app instance.

Label children are cached per label tuple so the request path pays a dict lookup and
an observe, not prometheus_client's label resolution.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gateway.routing.registry import Registry
    from gateway.routing.scraper import MetricsScraper
    from gateway.routing.trust import TrustPolicies

from gateway import __version__

__all__ = ["GatewayMetrics"]

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "owngate_requests",
            "Requests answered, by endpoint, HTTP status and backend ('-' when none).",
            ["endpoint", "status", "backend"],
            registry=r,
        )
        self.latency = Histogram(
            "owngate_request_duration_seconds",
            "Time from request received to last response byte sent.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "owngate_time_to_first_token_seconds",
            "Streams: time from request received to the first body chunk relayed.",
            ["endpoint", "backend"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "owngate_backend_inflight",
            "Requests the gateway has in flight to each backend.",
            ["backend"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "owngate_upstream_errors",
            "Failed exchanges with backends, by kind (connect, timeout, closed, protocol, status).",
            ["backend", "kind"],
            registry=r,
        )
        info = Gauge("owngate_build_info", "Build information.", ["version"], registry=r)
        info.labels(__version__).set(1)
        self._children: dict[tuple[object, ...], MetricWrapperBase] = {}

    def watch_policies(self, trust: TrustPolicies) -> None:
        """Publish the active policy set and its failed reloads, read at scrape time."""
        self.registry.register(_PolicyCollector(trust))

    def watch_backends(self, registry: Registry, scraper: MetricsScraper) -> None:
        """Publish each backend's scraped load, read fresh at every /metrics scrape."""
        self.registry.register(_BackendLoadCollector(registry, scraper))

    def _child(self, metric: MetricWrapperBase, *labels: str) -> MetricWrapperBase:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_request(self, endpoint: str, status: int, backend: str, seconds: float) -> None:
        self._child(self.requests, endpoint, str(status), backend).inc()  # type: ignore[attr-defined]
        self._child(self.latency, endpoint).observe(seconds)  # type: ignore[attr-defined]

    def observe_ttft(self, endpoint: str, backend: str, seconds: float) -> None:
        self._child(self.ttft, endpoint, backend).observe(seconds)  # type: ignore[attr-defined]

    def set_inflight(self, backend: str, value: int) -> None:
        self._child(self.inflight, backend).set(value)  # type: ignore[attr-defined]

    def upstream_error(self, backend: str, kind: str) -> None:
        self._child(self.upstream_errors, backend, kind).inc()  # type: ignore[attr-defined]

    def render(self) -> bytes:
        return generate_latest(self.registry)


_LOAD_GAUGES = {
    "running": "Requests the backend reports running (its /metrics).",
    "waiting": "Requests the backend reports queued (its /metrics).",
    "kv_usage": "KV-cache use the backend reports, 0..1 (its /metrics).",
}


class _BackendLoadCollector(Collector):
    """Scraped backend load as gauges; a backend whose reading is stale is left out."""

    def __init__(self, registry: Registry, scraper: MetricsScraper) -> None:
        self._registry = registry
        self._scraper = scraper

    def collect(self) -> Iterator[Metric]:
        families = {
            field: GaugeMetricFamily(f"owngate_backend_{field}", text, labels=["backend"])
            for field, text in _LOAD_GAUGES.items()
        }
        age = GaugeMetricFamily(
            "owngate_backend_metrics_age_seconds",
            "Seconds since the backend's /metrics were last read successfully.",
            labels=["backend"],
        )
        for backend_id in self._registry.backends:
            seconds = self._scraper.age(backend_id)
            if seconds is not None:
                age.add_metric([backend_id], seconds)
            load = self._scraper.load(backend_id)
            if load is None:
                continue
            for field, family in families.items():
                value = getattr(load, field)
                if value is not None:
                    family.add_metric([backend_id], value)
        yield from families.values()
        yield age


class _PolicyCollector(Collector):
    def __init__(self, trust: TrustPolicies) -> None:
        self._trust = trust

    def collect(self) -> Iterator[Metric]:
        policy = self._trust.current
        info = GaugeMetricFamily(
            "owngate_policy_info",
            "The active trust-policy set (1), by id, version and digest.",
            labels=["id", "version", "digest"],
        )
        info.add_metric([policy.id, policy.version, policy.digest], 1)
        yield info
        failures = CounterMetricFamily(
            "owngate_policy_reload_failures",
            "Policy reloads that failed validation (the last good set stayed active).",
        )
        failures.add_metric([], self._trust.reload_failures)
        yield failures
