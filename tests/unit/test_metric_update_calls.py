"""What a request's metric updates cost in Python calls (gateway/api/metrics.py):
prometheus_client's own `Counter.inc` and `Histogram.observe` make three or four each
(the observability check, its helper, the value's locked add); the updates the gateway
caches per label values make one for a counter, three for a histogram."""

from __future__ import annotations

from prometheus_client import generate_latest

from gateway.api.metrics import GatewayMetrics
from tests.helpers.python_calls import python_calls


def test_a_request_s_answer_and_decision_metrics_cost_a_call_per_update() -> None:
    """A request's answer (its counter and latency histogram) and its policy decision (a
    counter per rule, two here)."""
    metrics = GatewayMetrics()

    def request() -> None:
        metrics.observe_request("chat", 200, "sim-a", 0.0004)
        metrics.decided(("p/r1", "p/r2"))

    request()  # the first request of these labels looks their children up
    calls = python_calls(request)
    # its two methods; three counter adds; the latency observer, its sum's and
    # its bucket's adds (prometheus_client's own: 24 calls)
    assert len(calls) <= 2 + 3 + 3, calls
    text = generate_latest(metrics.registry).decode()
    assert 'owngate_requests_total{backend="sim-a",endpoint="chat",status="200"} 2.0' in text
    assert 'owngate_policy_decisions_total{rule="p/r1"} 2.0' in text
    assert 'owngate_policy_decisions_total{rule="p/r2"} 2.0' in text
    assert 'owngate_request_duration_seconds_bucket{endpoint="chat",le="0.001"} 2.0' in text
    assert 'owngate_request_duration_seconds_count{endpoint="chat"} 2.0' in text
