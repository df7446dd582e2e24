"""Shared in-flight counts on the request path: requests feed the state, and routing
reads this replica's count plus the other replicas' (`BackendState.peer_inflight`, set
from the state after each sync) in every strategy and in the saturation check."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import httpx
import pytest

from gateway.app import create_app
from gateway.config.schema import PoolSettings, RoutingSettings
from gateway.routing.picker import Picker
from gateway.routing.registry import Registry, Route
from gateway.routing.router import Outcome, Router
from gateway.state import MemoryState
from tests.helpers.gateways import Gateway, Sim, backend, decision, gateway_config
from tests.helpers.waiting import until


def pool(*capacities: int) -> Registry:
    return Registry.build(
        gateway_config(
            [
                backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", "m", capacity=capacity)
                for i, capacity in enumerate({"max_concurrency": c} for c in capacities)
            ]
        ),
        environ={},
    )


def order(registry: Registry, strategy: str) -> list[str]:
    routing = RoutingSettings(default=PoolSettings(strategy=strategy))  # type: ignore[arg-type]
    picker = Picker(routing, lambda _id: None, random.Random(7))
    routes: tuple[Route, ...] = registry.routes["m"]
    return [r.backend.id for r in picker.order("m", routes, None)]


def first_planned(registry: Registry, strategy: str) -> str:
    """The backend the router's plan offers a request for `m` to first."""
    routing = RoutingSettings(default=PoolSettings(strategy=strategy))  # type: ignore[arg-type]
    router = Router(registry, routing, lambda _id: None, 1.0, MemoryState())
    allowed = decision(tuple(registry.backends))
    plan = asyncio.run(router.plan("m", allowed, {}, time.perf_counter()))
    attempt = next(iter(plan))
    plan.report(attempt, Outcome.ended)
    return attempt.backend.id


@pytest.mark.parametrize("strategy", ["score", "least_inflight"])
@pytest.mark.parametrize(
    ("local", "peers", "first"),
    [
        ({"b0": 0, "b1": 1}, {}, "b0"),  # alone: this replica's counts decide
        ({"b0": 0, "b1": 1}, {"b0": 3}, "b1"),  # others loaded b0
        ({"b0": 2, "b1": 0}, {"b1": 1}, "b1"),  # 2 here vs 1 elsewhere
        ({"b0": 2, "b1": 0}, {"b1": 3, "b9": 5}, "b0"),  # unknown ids are ignored
    ],
)
def test_routing_counts_every_replica(
    strategy: str, local: dict[str, int], peers: dict[str, int], first: str
) -> None:
    registry = pool(4, 4)
    for backend_id, count in local.items():
        registry.backends[backend_id].inflight = count
    registry.set_peer_inflight(peers)
    assert order(registry, strategy)[0] == first
    assert first_planned(registry, strategy) == first
    assert [b.inflight for b in registry.backends.values()] == list(local.values())


def test_a_new_sync_replaces_the_peer_counts() -> None:
    registry = pool(4, 4)
    registry.set_peer_inflight({"b0": 3, "b1": 1})
    registry.set_peer_inflight({"b1": 2})  # b0's requests elsewhere ended
    assert [b.peer_inflight for b in registry.backends.values()] == [0, 2]
    assert [b.global_inflight for b in registry.backends.values()] == [0, 2]
    registry.set_peer_inflight({})  # the store went away: local counts only
    assert [b.peer_inflight for b in registry.backends.values()] == [0, 0]


def test_saturation_counts_every_replica() -> None:
    app = create_app(
        gateway_config(
            [backend("gpu", "http://127.0.0.1:9", "m", capacity={"max_concurrency": 4})]
        ),
        environ={},
    )
    gpu = app.registry.backends["gpu"]
    gpu.inflight = 4
    assert app.proxy.router.queue_per_slot(gpu) == 0.0  # full, nothing queued
    app.registry.set_peer_inflight({"gpu": 2})
    assert app.proxy.router.queue_per_slot(gpu) == 0.5  # 2 waiting per 4 slots, all replicas


def test_requests_feed_the_shared_counts(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim("vllm", models=("m",), decode_tokens_per_s=20)
    gateway = start_gateway([backend("gpu", sim.url, "m")])
    state = gateway.app.state
    body = {
        "model": "m",
        "max_tokens": 500,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    with (
        httpx.Client(base_url=gateway.url, headers=gateway.headers, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        chunks = response.iter_raw()  # kept: a dropped generator closes the response
        next(chunks)
        assert state.local_inflight("gpu") == state.inflight("gpu") == 1
    # The client left: counted out.
    until(lambda: state.local_inflight("gpu") == 0, "gpu counted out", timeout=10.0)
    with httpx.Client(base_url=gateway.url, headers=gateway.headers, timeout=30) as client:
        short = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
        assert client.post("/v1/chat/completions", json=short).status_code == 200
    assert state.local_inflight("gpu") == 0
