"""The scorers of the `score` strategy and the load model they share with the saturation
check, table-driven (each formula as its module's docstring gives it)."""

from __future__ import annotations

import pytest

from gateway.routing.load import demand_and_slots, queue_per_slot
from gateway.routing.registry import BackendState
from gateway.routing.scorers.affinity import affinity_score
from gateway.routing.scorers.kv import kv_score
from gateway.routing.scorers.prefill import prefill_score, prefill_tokens
from gateway.routing.scorers.queue import queue_score
from gateway.routing.signals import BackendLoad
from tests.helpers.gateways import lone_backend


@pytest.mark.parametrize(
    ("demand", "slots", "score"),
    [(0, 4, 1.0), (2, 4, 0.75), (4, 4, 0.5), (6, 4, 0.25), (8, 4, 0.0), (20, 4, 0.0), (1, 1, 0.5)],
)
def test_queue_score(demand: float, slots: float, score: float) -> None:
    assert queue_score(demand, slots) == pytest.approx(score)


@pytest.mark.parametrize(
    ("kv_usage", "score"),
    [(None, 0.5), (0.0, 1.0), (0.25, 0.75), (0.9, 0.1), (1.0, 0.0), (1.5, 0.0), (-0.1, 1.0)],
)
def test_kv_score(kv_usage: float | None, score: float) -> None:
    assert kv_score(kv_usage) == pytest.approx(score)


@pytest.mark.parametrize(
    ("preferred", "lightly_loaded", "demand", "slots", "score"),
    [
        (True, True, 0, 4, 1.0),  # it holds the prefix and has room
        (False, True, 0, 4, 0.0),  # another backend served the prefix
        (True, False, 0, 4, 0.0),  # busier than the least loaded by more than the slack
        (True, True, 4, 4, 0.0),  # saturated: affinity would build a queue
        (True, True, 3.9, 4, 1.0),
    ],
)
def test_affinity_score(
    preferred: bool, lightly_loaded: bool, demand: float, slots: float, score: float
) -> None:
    assert affinity_score(preferred, lightly_loaded, demand, slots) == score


@pytest.mark.parametrize(
    ("prefilling", "busiest", "lightly_loaded", "score"),
    [
        (0, 0, True, 1.0),
        (0, 8192, True, 1.0),
        (8192, 8192, True, 1.0 - 8192 / 9216),
        (1024, 1024, True, 0.5),
        (0, 1024, False, 0.5),  # a busier candidate is scored as if it had the largest
    ],
)
def test_prefill_score(prefilling: int, busiest: int, lightly_loaded: bool, score: float) -> None:
    assert prefill_score(prefilling, busiest, lightly_loaded) == pytest.approx(score)


@pytest.mark.parametrize(
    ("body_bytes", "cached_bytes", "tokens"),
    [(4000, 0, 1000), (4000, 4096, 0), (4003, 0, 1000), (4000, 1000, 750), (3, 0, 0)],
)
def test_prefill_estimate(body_bytes: int, cached_bytes: int, tokens: int) -> None:
    assert prefill_tokens(body_bytes, cached_bytes) == tokens


def load(
    running: float | None = None,
    waiting: float | None = None,
    slots_total: int | None = None,
    gateway_inflight: int | None = None,
) -> BackendLoad:
    return BackendLoad(running, waiting, None, slots_total, gateway_inflight)


@pytest.mark.parametrize(
    ("backend_state", "scraped", "demand", "slots"),
    [
        (lone_backend(4), None, 0.0, 4.0),  # idle, configured capacity
        (lone_backend(), None, 0.0, 8.0),  # nothing known: 8 slots
        (lone_backend(4, inflight=2, peer_inflight=3), None, 5.0, 4.0),  # every replica counts
        (lone_backend(4, inflight=1), load(running=3, waiting=2), 5.0, 4.0),  # the scrape says more
        (
            lone_backend(4, inflight=6),
            load(running=3, waiting=2),
            6.0,
            4.0,
        ),  # the gateway says more
        # sent 2 more since the scrape (which counted 1 of the gateway's): 5 + (3 - 1)
        (lone_backend(4, inflight=3), load(running=3, waiting=2, gateway_inflight=1), 7.0, 4.0),
        (lone_backend(None), load(running=3, waiting=2), 5.0, 3.0),  # a queue: running = slots
        (lone_backend(None), load(running=3, waiting=0), 3.0, 8.0),
        (lone_backend(None), load(running=1, slots_total=16), 1.0, 16.0),  # llama.cpp's /props
        (lone_backend(None), load(running=0.5, waiting=1), 1.5, 1.0),  # at least one slot
    ],
)
def test_demand_and_slots(
    backend_state: BackendState, scraped: BackendLoad | None, demand: float, slots: float
) -> None:
    assert demand_and_slots(backend_state, scraped) == (demand, slots)


@pytest.mark.parametrize(
    ("backend_state", "scraped", "per_slot"),
    [
        (lone_backend(4, inflight=4), None, 0.0),  # full, nothing queued
        (lone_backend(4, inflight=4, peer_inflight=2), None, 0.5),  # 2 waiting per 4 slots
        (lone_backend(4, inflight=1), load(running=4, waiting=6), 1.5),  # the backend's own queue
        (lone_backend(None, inflight=9), None, 0.0),  # unknown capacity: never saturated
        (lone_backend(None), load(running=4, waiting=2), 0.5),  # running = slots
        (lone_backend(None, learned_slots=2, inflight=5), None, 1.5),  # llama.cpp's learned slots
    ],
)
def test_queue_per_slot(
    backend_state: BackendState, scraped: BackendLoad | None, per_slot: float
) -> None:
    assert queue_per_slot(backend_state, scraped) == pytest.approx(per_slot)
