"""The routing picker: each strategy and scorer, table-driven, with injected load."""

from __future__ import annotations

import random

import pytest

from gateway.config.schema import PoolSettings, RoutingSettings
from gateway.routing.picker import Picker
from gateway.routing.registry import Registry, Route
from gateway.routing.scorers.affinity import prefix_key
from gateway.routing.signals import BackendLoad
from tests.helpers.gateways import backend, gateway_config


def routes(*caps: int | None) -> list[Route]:
    config = gateway_config(
        [
            backend(
                f"b{i}",
                f"http://127.0.0.1:{9000 + i}",
                "m",
                capacity={"max_concurrency": cap} if cap else {},
            )
            for i, cap in enumerate(caps)
        ]
    )
    return list(Registry.build(config, environ={}).routes["m"])


def picker(strategy: str = "score", loads: dict[str, BackendLoad] | None = None) -> Picker:
    routing = RoutingSettings(default=PoolSettings(strategy=strategy))  # type: ignore[arg-type]
    table = loads or {}
    return Picker(routing, table.get, random.Random(7))


def ids(ordered: list[Route]) -> list[str]:
    return [r.backend.id for r in ordered]


def test_score_prefers_the_backend_with_room() -> None:
    pool = routes(4, 4)
    pool[0].backend.inflight = 4  # at capacity
    assert ids(picker().order("m", pool, None)) == ["b1", "b0"]


def test_scraped_queue_counts_even_without_gateway_traffic() -> None:
    pool = routes(4, 4)
    loads = {"b0": BackendLoad(running=4, waiting=6, kv_usage=0.9, slots_total=None)}
    assert ids(picker(loads=loads).order("m", pool, None)) == ["b1", "b0"]


@pytest.mark.parametrize(
    ("inflight", "expected"),
    [
        (0, 1.0 + 0.3 * 0.5 + 0.5 + 1.0),  # idle, kv unknown, affinity counts, no prefill
        (2, 0.75 + 0.15 + 0.5 + 1.0),
        (4, 0.5 + 0.15 + 0.0 + 1.0),  # saturated: affinity no longer counts
        (8, 0.0 + 0.15 + 0.0 + 1.0),
    ],
)
def test_score_formula(inflight: int, expected: float) -> None:
    (route,) = routes(4)
    route.backend.inflight = inflight
    p = picker()
    assert p.score(p.pool("m"), route.backend, preferred=True) == pytest.approx(expected)


def test_affinity_sends_a_shared_prefix_back_while_there_is_room() -> None:
    pool = routes(32, 32)
    p = picker()
    prefix = b"k" * 16
    p.served(prefix, "b1")
    pool[0].backend.inflight, pool[1].backend.inflight = 4, 5  # a little busier: keeps it
    assert ids(p.order("m", pool, prefix))[0] == "b1"
    pool[1].backend.inflight = 8  # 1/8 busier per slot than b0: affinity yields to load
    assert ids(p.order("m", pool, prefix))[0] == "b0"


def test_prefill_backlog_sends_a_request_where_less_prompt_waits() -> None:
    pool = routes(64, 64)
    pool[0].backend.prefilling = 8000  # a RAG prompt has not had its first token yet
    pool[1].backend.inflight = 3  # more requests, but all of them already decoding
    assert ids(picker().order("m", pool, None)) == ["b1", "b0"]
    pool[1].backend.prefilling = 8000  # the same backlog on both: load decides
    assert ids(picker().order("m", pool, None)) == ["b0", "b1"]


def test_prefill_backlog_counts_only_among_the_least_loaded() -> None:
    big, small = routes(64, 4)
    big.backend.inflight, big.backend.prefilling = 20, 2000  # 0.31 per slot, prefill queued
    small.backend.inflight = 3  # 0.75 per slot: its slots all decoding, nothing pending
    assert ids(picker().order("m", [big, small], None)) == ["b0", "b1"]
    small.backend.inflight = 1  # 0.25 per slot: as lightly loaded, so its empty queue wins
    assert ids(picker().order("m", [big, small], None)) == ["b1", "b0"]


@pytest.mark.parametrize(
    ("prefilling", "busiest", "term"),
    [(0, 0, 1.0), (0, 8192, 1.0), (8192, 8192, 1.0 - 8192 / 9216), (1024, 1024, 0.5)],
)
def test_prefill_term_is_relative_to_the_busiest_candidate(
    prefilling: int, busiest: int, term: float
) -> None:
    mine, other = (route.backend for route in routes(4, 4))
    p = picker()
    pool = p.pool("m")
    base = p.scores(pool, [mine, other], None)[0] - 1.0  # every other term: no backlog
    mine.prefilling, other.prefilling = prefilling, busiest
    got = p.scores(pool, [mine, other], None)[0] - base
    assert got == pytest.approx(term)


def test_round_robin_and_least_inflight() -> None:
    pool = routes(None, None, None)
    rr = picker("round_robin")
    assert [ids(rr.order("m", pool, None))[0] for _ in range(4)] == ["b0", "b1", "b2", "b0"]
    pool[0].backend.inflight, pool[1].backend.inflight = 5, 1
    assert ids(picker("least_inflight").order("m", pool, None)) == ["b2", "b1", "b0"]


def test_prefix_key_covers_the_shared_part_only() -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 10}
    a = {"messages": [system, {"role": "user", "content": "first question"}]}
    b = {"messages": [system, {"role": "user", "content": "another question"}]}
    assert prefix_key(a, 4096) == prefix_key(b, 4096) is not None
    assert prefix_key({"messages": [{"role": "user", "content": "hi"}]}, 4096) is None
    assert prefix_key({"prompt": "x" * 100}, 4096) is not None


def test_prefix_key_is_each_tenants_own() -> None:
    """One tenant's prompt prefix never names another's: a tenant that sent a guess of
    another's conversation must not find out where (or whether) that tenant sent it."""
    system = {"role": "system", "content": "You are a careful assistant. " * 10}
    doc = {"messages": [system, {"role": "user", "content": "first question"}]}
    acme = prefix_key(doc, 4096, "acme")
    assert acme == prefix_key(doc, 4096, "acme") is not None
    assert acme != prefix_key(doc, 4096, "other")
    assert prefix_key(doc, 4096, "a" * 63) is not None  # the longest tenant id


def test_the_affinity_table_keeps_only_the_newest_prefixes() -> None:
    """Every distinct prompt prefix a client sends is a key of the affinity table: past
    `_AFFINITY_ENTRIES` (65,536) the prefix served longest ago is forgotten, so a client
    sending a new prefix with each request holds at most that many entries."""
    chosen = picker()
    cap = 65_536
    prefixes = [n.to_bytes(16, "big") for n in range(cap + 1_000)]
    for prefix in prefixes:
        chosen.served(prefix, "gpu-a")
    assert len(chosen._affinity) == cap
    assert not chosen.holds(prefixes[999], "gpu-a")  # the oldest forgotten
    assert chosen.holds(prefixes[1_000], "gpu-a")
    assert chosen.holds(prefixes[-1], "gpu-a")
    chosen.served(prefixes[1_000], "gpu-b")  # served again: the newest, not the next to go
    chosen.served(b"another prefix..", "gpu-a")
    assert chosen.holds(prefixes[1_000], "gpu-b")
    assert not chosen.holds(prefixes[1_001], "gpu-a")
