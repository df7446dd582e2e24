"""The gateway's own Prometheus metrics, on a registry owned by one app instance.

Label children are cached per label tuple so the request path pays a dict lookup and
an observe, not prometheus_client's label resolution. What the gateway already knows
(backend health and breakers, shared state, the policy set, the provenance log, the
witnesses) is read by collectors at scrape time, costing requests nothing. The names are
a contract: deploy/observability/ (the Grafana dashboard and the alert rules) uses them,
and tests/integration/test_observability.py checks each one against a live gateway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gateway.api.recorder import Recorder
    from gateway.policy_set import TrustPolicies
    from gateway.provenance.writer.cosignature_collector import Cosigning
    from gateway.routing.registry import Registry
    from gateway.routing.scraper import MetricsScraper
    from gateway.state import SharedState

from gateway import __version__, access_log

__all__ = ["GatewayMetrics"]

_DISPATCH_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
)

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
            "Failed exchanges with backends, by kind (connect, timeout, closed, protocol, "
            "status, tls, ...).",
            ["backend", "kind"],
            registry=r,
        )
        self.dispatch_wait = Histogram(
            "owngate_provenance_dispatch_wait_seconds",
            "Time a request waited for its dispatch record to be durable before it was "
            "sent upstream (group commit and fsync included): what the log adds to TTFT.",
            buckets=_DISPATCH_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "owngate_fallbacks",
            "Requests a hosted backend served as a fallback, by backend and reason "
            "(private_unavailable, private_saturated).",
            ["backend", "reason"],
            registry=r,
        )
        self.refusals = Counter(
            "owngate_policy_refusals",
            "Requests refused before dispatch, by the policy rule that refused them and "
            "the error code (policy_denied, no_compliant_backend, ...).",
            ["rule", "code"],
            registry=r,
        )
        self.attestations = Counter(
            "owngate_attestations",
            "Answers of attested backends (`attest` in gateway.yaml), by backend and result: "
            "ok, or why the sidecar's countersignature was not accepted (missing, malformed, "
            "wrong_key, bad_signature, mismatch, replayed).",
            ["backend", "result"],
            registry=r,
        )
        self.stripped_comments = Counter(
            "owngate_sse_comments_stripped",
            "SSE comment lines starting `owngate-` that a private backend's stream held and "
            "the gateway removed (only the gateway writes them), by backend.",
            ["backend"],
            registry=r,
        )
        self.over_bound = Counter(
            "owngate_usage_over_bound",
            "Answers whose reported token usage exceeded what the request justified; the "
            "tenant was charged the bound instead (docs/state.md), by backend.",
            ["backend"],
            registry=r,
        )
        self.decisions = Counter(
            "owngate_policy_decisions",
            "Policy decisions each rule took part in (admitted or excluded a backend, "
            "refused, rejected a label, gave a default data class), by declared rule id.",
            ["rule"],
            registry=r,
        )
        r.register(_AccessLogCollector())
        info = Gauge("owngate_build_info", "Build information.", ["version"], registry=r)
        info.labels(__version__).set(1)
        self._children: dict[tuple[object, ...], MetricWrapperBase] = {}
        self._watching: dict[str, Collector] = {}

    def _watch(self, what: str, collector: Collector) -> None:
        """Register `collector`, replacing the one that watched `what` before (a config
        reload swaps the objects watched)."""
        previous = self._watching.pop(what, None)
        if previous is not None:
            self.registry.unregister(previous)
        self.registry.register(collector)
        self._watching[what] = collector

    def watch_policies(self, trust: TrustPolicies) -> None:
        """Publish the active policy set and its failed reloads, read at scrape time."""
        self._watch("policies", _PolicyCollector(trust))

    def watch_backends(self, registry: Registry, scraper: MetricsScraper) -> None:
        """Publish each backend's scraped load, read fresh at every /metrics scrape."""
        self._watch("backends", _BackendLoadCollector(registry, scraper))

    def watch_config(self, failures: Callable[[], int]) -> None:
        """Publish the failed reloads of gateway.yaml (`failures()`, read at each scrape)."""
        self._watch("config", _ConfigCollector(failures))

    def watch_state(self, state: SharedState, registry: Callable[[], Registry]) -> None:
        """Publish shared-state health and the other replicas' in-flight counts, read at
        scrape time (`registry` gives the registry in use, which a reload replaces)."""
        self.registry.register(_StateCollector(state, registry))

    def watch_provenance(self, recorder: Recorder) -> None:
        """Publish the provenance log's readiness, size and newest checkpoint, read at
        scrape time."""
        self.registry.register(_ProvenanceCollector(recorder))

    def watch_cosigning(self, cosigning: Cosigning) -> None:
        """Publish each witness's cosigning progress and failures, read at scrape time."""
        self.registry.register(_CosigningCollector(cosigning))

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

    def attestation(self, backend: str, result: str) -> None:
        self._child(self.attestations, backend, result).inc()  # type: ignore[attr-defined]

    def sse_comments_stripped(self, backend: str, lines: int) -> None:
        self._child(self.stripped_comments, backend).inc(lines)  # type: ignore[attr-defined]

    def usage_over_bound(self, backend: str) -> None:
        self._child(self.over_bound, backend).inc()  # type: ignore[attr-defined]

    def fallback(self, backend: str, reason: str) -> None:
        """A hosted backend served a request as a fallback (`reason`: the plan's)."""
        self._child(self.fallbacks, backend, reason).inc()  # type: ignore[attr-defined]

    def refusal(self, rule: str, code: str) -> None:
        """A request was refused before dispatch by policy `rule` with error `code`."""
        self._child(self.refusals, rule, code).inc()  # type: ignore[attr-defined]

    def decided(self, rules: Iterable[str]) -> None:
        """A request was decided by the policy set; `rules`: the declared rule ids that
        took part (never a client-supplied value)."""
        for rule in rules:
            self._child(self.decisions, rule).inc()  # type: ignore[attr-defined]

    def render(self) -> bytes:
        return generate_latest(self.registry)


_LOAD_GAUGES = {
    "running": "Requests the backend reports running (its /metrics).",
    "waiting": "Requests the backend reports queued (its /metrics).",
    "kv_usage": "KV-cache use the backend reports, 0..1 (its /metrics).",
}


_BREAKER_STATES = ("closed", "open", "half_open")


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
        breaker = GaugeMetricFamily(
            "owngate_backend_breaker_state",
            "The backend's circuit breaker: 1 for its current state (closed, open, half_open).",
            labels=["backend", "state"],
        )
        opens = CounterMetricFamily(
            "owngate_backend_breaker_opens",
            "Times the backend's circuit breaker opened (failures or a failed /health probe).",
            labels=["backend"],
        )
        scoped = GaugeMetricFamily(
            "owngate_backend_tenant_breakers_open",
            "Tenants whose own requests made the backend fail and which it admits no "
            "request of now (its circuit breakers scoped to one tenant); others still use it.",
            labels=["backend"],
        )
        up = GaugeMetricFamily(
            "owngate_backend_up",
            "1 while routing may send the private backend requests; 0 while its health "
            "probe marks it down or its circuit breaker admits none.",
            labels=["backend"],
        )
        slots = GaugeMetricFamily(
            "owngate_backend_slots",
            "Concurrency slots: capacity.max_concurrency, or learned from llama.cpp /props.",
            labels=["backend"],
        )
        now = self._registry.clock()
        for backend_id, state in self._registry.backends.items():
            if state.config.is_private:  # hosted providers are not judged by a breaker
                current = state.breaker.state.value
                for name in _BREAKER_STATES:
                    breaker.add_metric([backend_id, name], 1.0 if name == current else 0.0)
                opens.add_metric([backend_id], state.breaker.opens)
                scoped.add_metric([backend_id], state.tenant_breakers.open_count(now))
                up.add_metric([backend_id], 0.0 if self._registry.is_down(state) else 1.0)
            known = state.config.capacity.max_concurrency or state.learned_slots
            if known:
                slots.add_metric([backend_id], known)
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
        yield breaker
        yield opens
        yield scoped
        yield up
        yield slots


class _StateCollector(Collector):
    """Shared state (docs/state.md): healthy or on local fallback, and what it shares."""

    def __init__(self, state: SharedState, registry: Callable[[], Registry]) -> None:
        self._state = state
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        status = self._state.status()
        healthy = GaugeMetricFamily(
            "owngate_state_healthy",
            "1 while shared state works (memory, or Redis answering); 0 while limits and "
            "routing fall back to this replica's local state.",
            labels=["backend"],
        )
        healthy.add_metric([status.backend], 1 if status.healthy else 0)
        yield healthy
        yield GaugeMetricFamily(
            "owngate_state_replicas",
            "Live gateway replicas sharing state, as of the last sync (this one included).",
            value=status.replicas,
        )
        yield CounterMetricFamily(
            "owngate_state_fallbacks",
            "Decisions made on local state because the shared store was unavailable.",
            value=status.fallbacks,
        )
        yield CounterMetricFamily(
            "owngate_state_errors",
            "Shared-store calls that failed or timed out.",
            value=status.errors,
        )
        yield GaugeMetricFamily(
            "owngate_state_pending_revocations",
            "Key revocations made here that the shared store has not stored yet.",
            value=status.pending_revocations,
        )
        peers = GaugeMetricFamily(
            "owngate_backend_peer_inflight",
            "Requests the other gateway replicas have in flight to each backend, as of the "
            "last shared-state sync.",
            labels=["backend"],
        )
        for backend in self._registry().backends.values():
            peers.add_metric([backend.id], backend.peer_inflight)
        yield peers


class _CosigningCollector(Collector):
    """Witness cosignatures on the provenance log's checkpoints (docs/provenance.md)."""

    def __init__(self, cosigning: Cosigning) -> None:
        self._cosigning = cosigning

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            "owngate_witness_cosigned_size",
            "Tree size of the newest checkpoint each witness cosigned (absent until one).",
            labels=["witness"],
        )
        up = GaugeMetricFamily(
            "owngate_witness_up", "0 while the witness's last attempt failed.", labels=["witness"]
        )
        done = CounterMetricFamily(
            "owngate_witness_cosignatures", "Checkpoints cosigned.", labels=["witness"]
        )
        failed = CounterMetricFamily(
            "owngate_witness_failures",
            "Failed cosigning attempts (down, timeout, refused, bad answer).",
            labels=["witness"],
        )
        for witness in self._cosigning.witnesses:
            if witness.cosigned_size is not None:
                size.add_metric([witness.name], witness.cosigned_size)
            up.add_metric([witness.name], 0 if witness.consecutive_failures else 1)
            done.add_metric([witness.name], witness.cosignatures)
            failed.add_metric([witness.name], witness.failures)
        yield from (size, up, done, failed)


class _ProvenanceCollector(Collector):
    """The provenance log (docs/provenance.md): whether requests can be recorded (without
    that they are refused), how many entries it holds, and its newest signed checkpoint
    (what witnesses cosign: `owngate_witness_cosigned_size` trails it while they lag)."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def collect(self) -> Iterator[Metric]:
        recorder = self._recorder
        opened = recorder.opened
        log = recorder.log if opened else None
        yield GaugeMetricFamily(
            "owngate_provenance_ready",
            "1 while the provenance log is open and writable; 0 before it opens and while "
            "a write or checkpoint fails (proxied requests are refused then).",
            value=1 if log is not None and log.last_error is None else 0,
        )
        if log is None:
            return
        yield GaugeMetricFamily(
            "owngate_provenance_entries", "Entries made durable in the log.", value=log.size
        )
        latest = log.latest_checkpoint()
        if latest is not None:
            yield GaugeMetricFamily(
                "owngate_provenance_checkpoint_size",
                "Tree size of the newest signed checkpoint.",
                value=latest.checkpoint.size,
            )


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


class _AccessLogCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "owngate_access_log_dropped",
            "Access-log lines dropped: the log stream was too slow for the bounded buffer "
            "(or gone).",
        )
        dropped.add_metric([], access_log.dropped_total())
        yield dropped


class _ConfigCollector(Collector):
    def __init__(self, failures: Callable[[], int]) -> None:
        self._failures = failures

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "owngate_config_reload_failures",
            "gateway.yaml reloads that failed (the running config stayed active).",
        )
        failures.add_metric([], self._failures())
        yield failures
