"""The gateway's own Prometheus metrics, on a registry owned by one app instance.

Label children are cached per label tuple so the request path pays a dict lookup and
an observe, not prometheus_client's label resolution.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from gateway import __version__

__all__ = ["GatewayMetrics"]

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
)  # fmt: skip


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
