"""The gateway's own Prometheus metrics, on a registry owned by one app instance.

Label children are cached per label tuple so the request path pays a dict lookup and
an observe, not prometheus_client's label resolution; the metrics every request updates
(requests, latency, the policy decisions, the dispatch wait) cache the update itself
(`counter_adder`, `histogram_observer`): one call where prometheus_client makes three or
four. What the gateway already knows
(backend health and breakers, in-flight counts, shared state, the policy set, the
provenance log, the witnesses) is read by collectors at scrape time
(metric_collectors.py), costing requests nothing. The names are a contract:
deploy/observability/ (the Grafana dashboard and the alert rules) uses them, and
tests/integration/test_observability.py checks each one against a live gateway.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gateway.api.recorder import Recorder
    from gateway.policy_set import TrustPolicies
    from gateway.provenance.writer.cosignature_collector import Cosigning
    from gateway.routing.registry import Registry
    from gateway.routing.scraper import MetricsScraper
    from gateway.state import SharedState

from gateway import __version__
from gateway.api.metric_collectors import (
    AccessLogCollector,
    BackendLoadCollector,
    ConfigCollector,
    CosigningCollector,
    PolicyCollector,
    ProvenanceCollector,
    StateCollector,
)

__all__ = ["GatewayMetrics", "counter_adder", "histogram_observer"]

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
        self.upstream_errors = Counter(
            "owngate_upstream_errors",
            "Failed exchanges with backends, by kind (connect, timeout, closed, protocol, "
            "status, tls, ...).",
            ["backend", "kind"],
            registry=r,
        )
        self.hosted_attempts = Counter(
            "owngate_hosted_attempts",
            "Calls the gateway made to hosted providers (one per dispatched attempt, however "
            "it ended; not an attempt refused before sending or for which LiteLLM did not "
            "load), by backend: the base for a hosted backend's share of failures.",
            ["backend"],
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
        r.register(AccessLogCollector())
        info = Gauge("owngate_build_info", "Build information.", ["version"], registry=r)
        info.labels(__version__).set(1)
        self._children: dict[tuple[object, ...], MetricWrapperBase] = {}
        # the per-request updates, by label values (the cardinality `_children` holds)
        self._request_adds: dict[tuple[str, int, str], Callable[[float], None]] = {}
        self._latency_observes: dict[str, Callable[[float], None]] = {}
        self._decision_adds: dict[str, Callable[[float], None]] = {}
        self.observe_dispatch_wait = histogram_observer(self.dispatch_wait)
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
        self._watch("policies", PolicyCollector(trust))

    def watch_backends(self, registry: Registry, scraper: MetricsScraper) -> None:
        """Publish each backend's scraped load, read fresh at every /metrics scrape."""
        self._watch("backends", BackendLoadCollector(registry, scraper))

    def watch_config(self, failures: Callable[[], int]) -> None:
        """Publish the failed reloads of gateway.yaml (`failures()`, read at each scrape)."""
        self._watch("config", ConfigCollector(failures))

    def watch_state(self, state: SharedState, registry: Callable[[], Registry]) -> None:
        """Publish shared-state health and the other replicas' in-flight counts, read at
        scrape time (`registry` gives the registry in use, which a reload replaces)."""
        self.registry.register(StateCollector(state, registry))

    def watch_provenance(self, recorder: Recorder) -> None:
        """Publish the provenance log's readiness, size and newest checkpoint, read at
        scrape time."""
        self.registry.register(ProvenanceCollector(recorder))

    def watch_cosigning(self, cosigning: Cosigning) -> None:
        """Publish each witness's cosigning progress and failures, read at scrape time."""
        self.registry.register(CosigningCollector(cosigning))

    def _child(self, metric: MetricWrapperBase, *labels: str) -> MetricWrapperBase:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_request(self, endpoint: str, status: int, backend: str, seconds: float) -> None:
        key = (endpoint, status, backend)
        add = self._request_adds.get(key)
        if add is None:
            child = self.requests.labels(endpoint, str(status), backend)
            add = self._request_adds[key] = counter_adder(child)
        add(1)
        observe = self._latency_observes.get(endpoint)
        if observe is None:
            latency = self.latency.labels(endpoint)
            observe = self._latency_observes[endpoint] = histogram_observer(latency)
        observe(seconds)

    def observe_ttft(self, endpoint: str, backend: str, seconds: float) -> None:
        self._child(self.ttft, endpoint, backend).observe(seconds)  # type: ignore[attr-defined]

    def upstream_error(self, backend: str, kind: str) -> None:
        self._child(self.upstream_errors, backend, kind).inc()  # type: ignore[attr-defined]

    def hosted_attempt(self, backend: str) -> None:
        self._child(self.hosted_attempts, backend).inc()  # type: ignore[attr-defined]

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
        adds = self._decision_adds
        for rule in rules:
            add = adds.get(rule)
            if add is None:
                add = adds[rule] = counter_adder(self.decisions.labels(rule))
            add(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def counter_adder(counter: Counter) -> Callable[[float], None]:
    """What `counter.inc(amount)` does for an amount >= 0 without an exemplar, as one
    call. prometheus_client gives a counter its value only once it is observable (a
    labelled child, or a metric without labels), for good: the check its `Counter.inc`
    makes at every call (two more calls) then always passes, and the value's own `inc`
    (under its lock) is what is left. A counter without a value (a labelled metric's
    parent: `inc` refuses it) or not prometheus_client's `Counter` as this was written for
    (its `inc` replaced) keeps `counter.inc`."""
    value = getattr(counter, "_value", None)
    add = getattr(value, "inc", None)
    if type(counter).inc is not Counter.inc or not callable(add):
        return counter.inc
    return add  # type: ignore[no-any-return]


def histogram_observer(histogram: Histogram) -> Callable[[float], None]:
    """What `histogram.observe(amount)` does without an exemplar, as one call: the sum
    grows by `amount` and the first bucket whose bound is at least `amount` by one (none
    for NaN, as there), found by bisection over the bounds rather than a loop. As for
    `counter_adder`, only an observable histogram has its sum and buckets; one without
    them, or not prometheus_client's `Histogram` as this was written for, keeps
    `histogram.observe`."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if (
        type(histogram).observe is not Histogram.observe
        or not isinstance(bounds, list)
        or not isinstance(buckets, list)
        or len(bounds) != len(buckets)
        or not bounds
        or bounds != sorted(bounds)
        or bounds[-1] != float("inf")
        or not callable(getattr(total, "inc", None))
    ):
        return histogram.observe
    add_sum = total.inc  # type: ignore[union-attr]
    adds = [bucket.inc for bucket in buckets]
    last = bounds[-1]

    def observe(amount: float) -> None:
        add_sum(amount)
        if amount <= last:  # not NaN: some bucket takes it
            adds[bisect_left(bounds, amount)](1)

    return observe
