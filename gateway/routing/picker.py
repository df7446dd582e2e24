"""The picker: the eligible, healthy candidates of one request in the order to try them.

The model is the Gateway API Inference Extension's endpoint picker: filters → scorers →
picker. The filters (gateway/routing/filters/: trust, health) and the wait for a free
slot belong to the plan (gateway/routing/router.py); this module orders what they let
through by the strategy configured for the model (`routing.default` and
`routing.pools.<model>` in gateway.yaml): the first is tried first, the rest are the
failover order.

Strategies:
- `score` (default): each scorer (gateway/routing/scorers/) gives a backend 0..1 and
  the weighted sum (`weights`) orders the backends, ties broken at random (from an
  injected RNG): `queue` (room for a request, from the load model of
  gateway/routing/load.py), `kv` (free KV cache), `affinity` (its prefix cache holds
  the prompt's prefix) and `prefill` (little prompt waiting for its first token). The
  last two count only among the candidates about as lightly loaded as the least loaded
  one (bounded load, `load.LOAD_SLACK`).
- `least_inflight`: fewest requests in flight from the gateway (all replicas) first.
- `round_robin`: rotate through the backends, per model.

The picker also remembers which backend served a prompt prefix last (`served`, `holds`),
the affinity scorer's input.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Sequence

from gateway.config.schema import PoolSettings, RoutingSettings
from gateway.routing.load import LOAD_SLACK, demand_and_slots
from gateway.routing.registry import BackendState, Route
from gateway.routing.scorers.affinity import affinity_score
from gateway.routing.scorers.kv import kv_score
from gateway.routing.scorers.prefill import prefill_score
from gateway.routing.scorers.queue import queue_score
from gateway.routing.signals import BackendLoad

__all__ = ["LoadOf", "Picker"]

_AFFINITY_ENTRIES = 65536

LoadOf = Callable[[str], BackendLoad | None]


class Picker:
    def __init__(
        self, routing: RoutingSettings, load_of: LoadOf, rng: random.Random | None = None
    ) -> None:
        # What each request reads, as plain dicts and tuples: a pydantic model's attribute
        # is no specialized load (its class has a `__getattr__`), ~15x a plain one's cost.
        self._pools = dict(routing.pools)
        self._default = routing.default
        pools = (routing.default, *routing.pools.values())
        self._strategies = {id(pool): pool.strategy for pool in pools}
        self._weights = {id(pool): _weights(pool) for pool in pools}
        self._load_of = load_of
        self._rng = rng or random.Random()  # noqa: S311 - tie-breaking, not security
        self._turn: dict[str, int] = collections.defaultdict(int)
        self._affinity: collections.OrderedDict[bytes, str] = collections.OrderedDict()

    def pool(self, model: str) -> PoolSettings:
        return self._pools.get(model, self._default)

    def strategy(self, model: str) -> str:
        """The strategy of `model`'s pool (`pool(model).strategy`)."""
        return self._strategies[id(self._pools.get(model, self._default))]

    def order(self, model: str, routes: Sequence[Route], prefix: bytes | None) -> list[Route]:
        """The routes in the order to try them."""
        if len(routes) < 2:
            return list(routes)
        pool = self.pool(model)
        strategy = self._strategies[id(pool)]
        if strategy == "round_robin":
            start = self._turn[model] % len(routes)
            self._turn[model] += 1
            return [*routes[start:], *routes[:start]]
        if strategy == "least_inflight":
            return sorted(routes, key=lambda r: (r.backend.global_inflight, self._rng.random()))
        preferred = self._affinity.get(prefix) if prefix is not None else None
        scores = self.scores(pool, [route.backend for route in routes], preferred)
        random = self._rng.random
        scored = [(-score, random(), route) for score, route in zip(scores, routes, strict=True)]
        scored.sort(key=_by_score)
        return [route for _, _, route in scored]

    def score(self, pool: PoolSettings, backend: BackendState, preferred: bool) -> float:
        """One backend's score on its own (the prefill term then compares it with itself)."""
        return self.scores(pool, [backend], backend.id if preferred else None)[0]

    def scores(
        self, pool: PoolSettings, backends: Sequence[BackendState], preferred: str | None
    ) -> list[float]:
        """The weighted sum of the scorers for each backend, in one pass over them (this
        runs for every request with several candidates: no per-backend work beyond the
        load lookup and the scorers)."""
        load_of = self._load_of
        demands: list[float] = []
        slot_counts: list[float] = []
        kvs: list[float | None] = []
        for backend in backends:
            load = load_of(backend.id)
            demand, slots = demand_and_slots(backend, load)
            demands.append(demand)
            slot_counts.append(slots)
            kvs.append(load.kv_usage if load is not None else None)
        # Bounded load: affinity and the prefill backlog count only among the candidates
        # about as lightly loaded (demand per slot) as the least loaded one.
        ratios = [d / s for d, s in zip(demands, slot_counts, strict=True)]
        within = min(ratios) + LOAD_SLACK
        busiest = max([backend.prefilling for backend in backends])
        weights = self._weights.get(id(pool))
        w_queue, w_kv, w_affinity, w_prefill = _weights(pool) if weights is None else weights
        scores: list[float] = []
        for backend, demand, slots, kv, ratio in zip(
            backends, demands, slot_counts, kvs, ratios, strict=True
        ):
            lightly_loaded = ratio <= within
            score = w_queue * queue_score(demand, slots) + w_kv * kv_score(kv)
            if backend.id == preferred:  # the affinity scorer gives the others 0
                score += w_affinity * affinity_score(True, lightly_loaded, demand, slots)
            score += w_prefill * prefill_score(backend.prefilling, busiest, lightly_loaded)
            scores.append(score)
        return scores

    def holds(self, prefix: bytes | None, backend_id: str) -> bool:
        """Did `backend_id` serve this prefix last (so its prefix cache should hold it)?"""
        return prefix is not None and self._affinity.get(prefix) == backend_id

    def served(self, prefix: bytes | None, backend_id: str) -> None:
        """Remember which backend holds this prefix in its cache now."""
        if prefix is None:
            return
        affinity = self._affinity
        affinity[prefix] = backend_id
        affinity.move_to_end(prefix)
        while len(affinity) > _AFFINITY_ENTRIES:
            affinity.popitem(last=False)


def _weights(pool: PoolSettings) -> tuple[float, float, float, float]:
    weights = pool.weights
    return weights.queue, weights.kv, weights.affinity, weights.prefill


def _by_score(item: tuple[float, float, Route]) -> tuple[float, float]:
    return item[0], item[1]
