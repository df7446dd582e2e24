"""The admin timelines' sampler (gateway/admin/timeline.py): the TTFT quantile estimate
from histogram buckets, the bounded history, and that samples count only what happened
in their interval, keyed only by configured backends and declared rules."""

from __future__ import annotations

import itertools

import pytest

from gateway.admin.timeline import MAX_SAMPLES, Timeline, bucket_quantile
from gateway.api.app import GatewayApp
from gateway.app import create_app
from tests.helpers.clock import FakeClock
from tests.helpers.gateways import backend, gateway_config

INF = float("inf")


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, [(1.0, 0), (2.0, 10), (INF, 10)], 1.5),  # all in (1, 2]: its middle
        (0.5, [(1.0, 10), (INF, 10)], 0.5),  # the first bucket starts at 0
        (0.99, [(1.0, 50), (2.0, 100), (INF, 100)], 1.98),
        (0.5, [(1.0, 2), (2.0, 2), (4.0, 6), (INF, 6)], 2.5),  # rank 3: a quarter into (2, 4]
        (0.99, [(1.0, 1), (2.0, 1), (INF, 5)], 2.0),  # in +Inf: the highest finite bound
        (0.5, [(1.0, 0), (INF, 0)], None),  # nothing observed
        (0.5, [], None),
    ],
)
def test_a_quantile_is_interpolated_in_its_bucket(
    q: float, buckets: list[tuple[float, float]], expected: float | None
) -> None:
    assert bucket_quantile(q, buckets) == pytest.approx(expected)


def _app() -> GatewayApp:
    return create_app(gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]))


def test_the_history_is_bounded_by_the_settings() -> None:
    clock = itertools.count()
    timeline = Timeline(_app(), interval_s=2, history_s=10, clock=lambda: float(next(clock)))
    for _ in range(12):
        timeline.sample()
    for history in (timeline.backends, timeline.policies, timeline.log):
        assert [s["t"] for s in history()] == [7.0, 8.0, 9.0, 10.0, 11.0]  # the newest 10 s
        assert [s["t"] for s in history(since=9.0)] == [10.0, 11.0]
    huge = Timeline(_app(), interval_s=0.1, history_s=86400)
    assert huge.capacity == MAX_SAMPLES


def test_samples_count_what_happened_in_their_interval() -> None:
    app = _app()
    timeline = Timeline(app, interval_s=2, history_s=60)
    metrics = app.metrics
    for seconds in (0.2, 0.3, 0.4, 0.7):
        metrics.observe_request("chat", 200, "gpu", seconds)
        metrics.observe_ttft("chat", "gpu", seconds)
    metrics.observe_request("chat", 502, "gpu", 0.1)
    metrics.observe_request("chat", 200, "client-chosen", 0.1)  # not a configured backend
    rules = sorted(app.policies.current.rules)
    metrics.decided([rules[0], "not-a-rule"])
    metrics.refusal(rules[0], "policy_denied")
    timeline.sample()
    first = timeline.backends()[-1]["backends"]
    assert set(first) == {"gpu"}
    gpu = first["gpu"]
    assert (gpu["requests"], gpu["errors"], gpu["error_rate"]) == (5, 1, 0.2)
    assert gpu["inflight"] == 0 and gpu["breaker"] == "closed" and gpu["waiting"] is None
    # buckets 0.25: 1, 0.5: 3, 1: 4 — rank 2 halfway into (0.25, 0.5], 3.96 into (0.5, 1]
    assert gpu["ttft_p50_s"] == pytest.approx(0.375)
    assert gpu["ttft_p99_s"] == pytest.approx(0.98)
    policies = timeline.policies()[-1]
    assert policies["decisions"] == {rules[0]: 1} and policies["refusals"] == {rules[0]: 1}
    assert timeline.log()[-1] == {
        "t": timeline.log()[-1]["t"],
        "entries": None,
        "checkpoint_size": None,
        "cosigned_size": None,
    }
    metrics.observe_request("chat", 200, "gpu", 0.1)
    timeline.sample()
    second = timeline.backends()[-1]["backends"]["gpu"]
    assert (second["requests"], second["errors"], second["ttft_p50_s"]) == (1, 0, None)
    assert timeline.policies()[-1]["decisions"] == {}


def test_a_poller_gets_the_samples_taken_after_the_wall_clock_stepped_back() -> None:
    """The console polls with `?since=` the last `t` it holds. The wall clock steps back
    an hour (NTP, a resumed VM): every new sample is dated before that cursor, and `t >
    since` answered none of them for the hour (the charts froze). Now a cursor that is a
    sample's time answers the samples taken after that sample; forward steps change
    nothing."""
    wall = FakeClock(10_000.0)
    timeline = Timeline(_app(), interval_s=2, history_s=60, clock=wall)
    timeline.sample()
    wall.now += 2
    timeline.sample()
    cursor = 10_002.0
    wall.now -= 3600  # stepped back
    timeline.sample()
    wall.now += 2
    timeline.sample()
    for history in (timeline.backends, timeline.policies, timeline.log):
        assert [s["t"] for s in history(since=cursor)] == [6_402.0, 6_404.0]
        assert [s["t"] for s in history(since=6_404.0)] == []
        assert [s["t"] for s in history(since=6_403.0)] == [10_000.0, 10_002.0, 6_404.0]
    wall.now += 10 * 365 * 86400  # a step forward: dated after any cursor, as before
    timeline.sample()
    assert [s["t"] for s in timeline.log(since=6_404.0)] == [wall.now]
