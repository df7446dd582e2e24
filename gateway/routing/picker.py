"""Ordering the eligible backends of one request: filters → scorers → picker.

The trust policy has already filtered the candidates (a filter, never a score); health
filters out backends that are down. What remains is ordered by the strategy configured
for the model (`routing` in gateway.yaml): the first is tried first, the rest are the
failover order.

Strategies:
- `score` (default): each scorer returns 0..1, the weighted sum orders the backends
  (ties broken at random, from an injected RNG):
  - `queue` = 1 - min(1, demand / (2 * slots)), where demand is the larger of the
    gateway's in-flight count (this replica's plus the other replicas' as of the last
    shared-state sync) and the backend's scraped running + waiting (when fresh),
    and slots is `capacity.max_concurrency` (else the scraped running count, else 8):
    1 when idle, 0.5 at capacity, 0 at twice capacity.
  - `kv` = 1 - scraped KV-cache use (0.5 when unknown).
  - `affinity` = 1 for the backend that most recently served the same prompt prefix
    (its prefix cache holds it), 0 otherwise; it counts only while that backend's demand
    per slot is within 1/16 of the least loaded candidate's and below saturation, so
    affinity never builds a queue (bounded-load affinity).
- `least_inflight`: fewest requests in flight from the gateway (all replicas) first.
- `round_robin`: rotate through the backends, per model.
"""

from __future__ import annotations

import collections
import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from gateway.config.schema import Routing, RoutingPool
from gateway.routing.registry import BackendState, Route
from gateway.routing.signals import BackendLoad

__all__ = ["Picker", "prefix_key"]

_DEFAULT_SLOTS = 8
_AFFINITY_ENTRIES = 65536
_AFFINITY_SLACK = 1 / 16  # how much busier (demand per slot) the prefix's backend may be

LoadOf = Callable[[str], BackendLoad | None]


class Picker:
    def __init__(self, routing: Routing, load_of: LoadOf, rng: random.Random | None = None) -> None:
        self._routing = routing
        self._load_of = load_of
        self._rng = rng or random.Random()  # noqa: S311 - tie-breaking, not security
        self._turn: dict[str, int] = collections.defaultdict(int)
        self._affinity: collections.OrderedDict[bytes, str] = collections.OrderedDict()

    def pool(self, model: str) -> RoutingPool:
        return self._routing.pools.get(model, self._routing.default)

    def order(self, model: str, routes: Sequence[Route], prefix: bytes | None) -> list[Route]:
        """The routes in the order to try them."""
        if len(routes) < 2:
            return list(routes)
        pool = self.pool(model)
        if pool.strategy == "round_robin":
            start = self._turn[model] % len(routes)
            self._turn[model] += 1
            return [*routes[start:], *routes[:start]]
        if pool.strategy == "least_inflight":
            return sorted(routes, key=lambda r: (r.backend.global_inflight, self._rng.random()))
        preferred = self._affinity.get(prefix) if prefix is not None else None
        if preferred is not None:
            # Bounded-load affinity: the prefix's backend keeps it only while it is about
            # as lightly loaded as the least loaded candidate (otherwise requests split by
            # system prompt instead of by load).
            ratios = {r.backend.id: self._ratio(r.backend) for r in routes}
            if ratios.get(preferred, 1.0) > min(ratios.values()) + _AFFINITY_SLACK:
                preferred = None
        scored = [
            (self.score(pool, r.backend, preferred == r.backend.id), self._rng.random(), r)
            for r in routes
        ]
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [route for _, _, route in scored]

    def score(self, pool: RoutingPool, backend: BackendState, preferred: bool) -> float:
        weights = pool.weights
        demand, slots, kv = self._demand(backend)
        queue = 1.0 - min(1.0, demand / (2.0 * slots))
        kv_score = 0.5 if kv is None else 1.0 - min(1.0, max(0.0, kv))
        affinity = 1.0 if preferred and demand < slots else 0.0
        return weights.queue * queue + weights.kv * kv_score + weights.affinity * affinity

    def _ratio(self, backend: BackendState) -> float:
        demand, slots, _ = self._demand(backend)
        return demand / slots

    def _demand(self, backend: BackendState) -> tuple[float, float, float | None]:
        load = self._load_of(backend.id)
        demand = float(backend.global_inflight)
        kv = None
        scraped_slots = None
        if load is not None:
            if load.running is not None or load.waiting is not None:
                demand = max(demand, (load.running or 0.0) + (load.waiting or 0.0))
            kv = load.kv_usage
            scraped_slots = load.slots_total or (load.running if load.waiting else None)
        slots = float(backend.config.capacity.max_concurrency or scraped_slots or _DEFAULT_SLOTS)
        return demand, max(slots, 1.0), kv

    def served(self, prefix: bytes | None, backend_id: str) -> None:
        """Remember which backend holds this prefix in its cache now."""
        if prefix is None:
            return
        affinity = self._affinity
        affinity[prefix] = backend_id
        affinity.move_to_end(prefix)
        while len(affinity) > _AFFINITY_ENTRIES:
            affinity.popitem(last=False)


def prefix_key(doc: dict[str, Any], chars: int) -> bytes | None:
    """A digest of the prompt's leading part (system prompt, earlier turns): requests that
    share it can reuse a backend's prefix cache. None when there is nothing to share."""
    messages = doc.get("messages")
    if isinstance(messages, list) and messages:
        # Everything but the newest turn is what a follow-up shares with its predecessor.
        head = messages[:-1] if len(messages) > 1 else messages
        try:
            text = orjson.dumps(head)
        except TypeError:
            return None
    else:
        prompt = doc.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return None
        text = prompt.encode()
    if len(text) < 64:
        return None  # too short to matter for a prefix cache
    return hashlib.blake2b(text[:chars], digest_size=16).digest()
