"""The per-request metric updates (gateway/api/metrics.py): the cached adders and
observers leave the exposition exactly as prometheus_client's own `inc` and `observe`
would, and cost one Python call each."""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.api.metrics import GatewayMetrics, counter_adder, histogram_observer

_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 1.0)
# at, between, below and past the bounds; the infinities; NaN (in no bucket, in the sum)
_AMOUNTS = [0.0, 0.001, 0.0011, 0.0025, 0.004, 0.005, 0.0099, 0.01, 0.5, 1.0, 1.5, 1e9]
_AMOUNTS += [-1.0, -math.inf, math.inf, math.nan, 0.003, 0.003]
_CREATED = re.compile(rb"^\S+_created(\{[^}]*\})? \S+$", re.M)


def _exposition(registry: CollectorRegistry) -> bytes:
    return _CREATED.sub(b"", generate_latest(registry))  # creation times differ


def _metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram, Histogram]:
    return (
        Counter("c", "c.", ["rule"], registry=registry),
        Histogram("h", "h.", ["endpoint"], buckets=_BOUNDS, registry=registry),
        Histogram("w", "w.", buckets=_BOUNDS, registry=registry),
    )


def test_the_cached_updates_expose_what_inc_and_observe_expose() -> None:
    public, cached = CollectorRegistry(), CollectorRegistry()
    (c1, h1, w1), (c2, h2, w2) = _metrics(public), _metrics(cached)
    add = counter_adder(c2.labels("r1"))
    observe, observe_plain = histogram_observer(h2.labels("chat")), histogram_observer(w2)
    for amount in _AMOUNTS:
        h1.labels("chat").observe(amount)
        w1.observe(amount)
        observe(amount)
        observe_plain(amount)
    for count in (1, 1, 3, 0, 2.5):
        c1.labels("r1").inc(count)
        add(count)
    # every sample of both: each bucket, sum and count
    assert _exposition(public) == _exposition(cached)
    text = generate_latest(cached).decode()
    assert 'h_bucket{endpoint="chat",le="0.001"} 4.0' in text  # 0.0, 0.001, -1, -inf
    assert 'h_count{endpoint="chat"} 17.0' in text  # NaN is in no bucket
    assert 'c_total{rule="r1"} 7.5' in text


def test_a_metric_still_missing_its_label_values_is_refused_as_by_inc() -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "c.", ["rule"], registry=registry)
    histogram = Histogram("h", "h.", ["endpoint"], registry=registry)
    add, observe = counter_adder(counter), histogram_observer(histogram)
    with pytest.raises(ValueError, match="missing label values"):
        add(1)
    with pytest.raises(ValueError, match="missing label values"):
        observe(0.1)


def test_another_counter_or_histogram_keeps_its_own_update() -> None:
    class Counting(Counter):
        def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
            super().inc(amount * 2)

    class Observing(Histogram):
        def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
            super().observe(amount)

    registry = CollectorRegistry()
    counter = Counting("c", "c.", registry=registry)
    histogram = Observing("h", "h.", registry=registry)
    assert counter_adder(counter) == counter.inc
    assert histogram_observer(histogram) == histogram.observe


def test_the_dispatch_wait_is_observed_in_its_histogram() -> None:
    metrics = GatewayMetrics()
    for wait in (0.0002, 0.0002, 0.003, 99.0):
        metrics.observe_dispatch_wait(wait)
    text = generate_latest(metrics.registry).decode()
    assert "owngate_provenance_dispatch_wait_seconds_count 4.0" in text
    assert 'owngate_provenance_dispatch_wait_seconds_bucket{le="0.00025"} 2.0' in text
    assert 'owngate_provenance_dispatch_wait_seconds_bucket{le="0.003"} 3.0' in text
    assert 'owngate_provenance_dispatch_wait_seconds_bucket{le="0.25"} 3.0' in text
