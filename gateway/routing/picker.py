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
    corrected by how the gateway's in-flight count changed since that scrape,
    and slots is `capacity.max_concurrency` (else the scraped running count, else 8):
    1 when idle, 0.5 at capacity, 0 at twice capacity.
  - `kv` = 1 - scraped KV-cache use (0.5 when unknown).
  - `affinity` = 1 for the backend that most recently served the same prompt prefix
    (its prefix cache holds it), 0 otherwise; it counts only while that backend's demand
    per slot is within 1/16 of the least loaded candidate's and below saturation, so
    affinity never builds a queue (bounded-load affinity).
  - `prefill` = 1 - P / (P_max + 1024), where P is the estimated prompt tokens this
    gateway has sent the backend that have no first byte yet (the prefill queued ahead
    of a new request; the prefix its cache should hold is not counted) and P_max the
    largest P among the candidates; a candidate busier than the least loaded one by more
    than 1/16 of its slots is scored as if it had P_max (bounded load, as for affinity).
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

__all__ = ["Picker", "prefix_key", "prefix_span"]

_DEFAULT_SLOTS = 8
_AFFINITY_ENTRIES = 65536
_LOAD_SLACK = 1 / 16  # how much busier (demand per slot) than the least loaded, at most
# Prompt tokens added to the largest prefill backlog among the candidates, so a few
# hundred tokens of difference weigh little and a long prompt's worth weighs a lot.
_PREFILL_DAMPING = 1024

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
        scores = self._scores(pool, [route.backend for route in routes], preferred)
        random = self._rng.random
        scored = [(-score, random(), route) for score, route in zip(scores, routes, strict=True)]
        scored.sort(key=_by_score)
        return [route for _, _, route in scored]

    def score(self, pool: RoutingPool, backend: BackendState, preferred: bool) -> float:
        """One backend's score on its own (the prefill term then compares it with itself)."""
        return self._scores(pool, [backend], backend.id if preferred else None)[0]

    def _scores(
        self, pool: RoutingPool, backends: Sequence[BackendState], preferred: str | None
    ) -> list[float]:
        """The weighted sum of the scorers for each backend, in one pass over them (this
        runs for every request: no per-backend calls beyond the load lookup)."""
        load_of = self._load_of
        demands: list[float] = []
        slot_counts: list[float] = []
        kvs: list[float | None] = []
        for backend in backends:
            load = load_of(backend.config.id)
            demand = float(backend.inflight + backend.peer_inflight)
            kv = scraped_slots = None
            if load is not None:
                running, waiting = load.running, load.waiting
                if running is not None or waiting is not None:
                    scraped = (running or 0.0) + (waiting or 0.0)
                    if load.gateway_inflight is not None:
                        # Stale by up to a scrape interval: add what the gateway sent since
                        # (or take off what finished), so a burst shows at once and a queue
                        # that drained does not linger.
                        scraped += demand - load.gateway_inflight
                    if scraped > demand:
                        demand = scraped
                kv = load.kv_usage
                scraped_slots = load.slots_total or (running if waiting else None)
            slots = float(
                backend.config.capacity.max_concurrency or scraped_slots or _DEFAULT_SLOTS
            )
            demands.append(demand)
            slot_counts.append(slots if slots > 1.0 else 1.0)
            kvs.append(kv)
        # Bounded load: affinity and the prefill backlog count only among the candidates
        # about as lightly loaded (demand per slot) as the least loaded one; a busier one
        # gets neither (else requests split by system prompt, or go to a small server
        # because its few slots have no prefill pending, instead of by load).
        ratios = [d / s for d, s in zip(demands, slot_counts, strict=True)]
        within = min(ratios) + _LOAD_SLACK
        busiest = max([backend.prefilling for backend in backends])
        damped = busiest + _PREFILL_DAMPING
        weights = pool.weights
        w_queue, w_kv, w_affinity, w_prefill = (
            weights.queue,
            weights.kv,
            weights.affinity,
            weights.prefill,
        )
        scores: list[float] = []
        for backend, demand, slots, kv, ratio in zip(
            backends, demands, slot_counts, kvs, ratios, strict=True
        ):
            busy = demand / (2.0 * slots)
            score = w_queue * (0.0 if busy >= 1.0 else 1.0 - busy)
            score += w_kv * (
                0.5 if kv is None else 0.0 if kv >= 1.0 else 1.0 if kv <= 0.0 else 1.0 - kv
            )
            lightly_loaded = ratio <= within
            if lightly_loaded and demand < slots and backend.config.id == preferred:
                score += w_affinity
            prefilling = backend.prefilling if lightly_loaded else busiest
            score += w_prefill * (1.0 - prefilling / damped)
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


def _by_score(item: tuple[float, float, Route]) -> tuple[float, float]:
    return item[0], item[1]


def prefix_key(doc: dict[str, Any], chars: int) -> bytes | None:
    """A digest of the prompt's leading part (system prompt, earlier turns): requests that
    share it can reuse a backend's prefix cache. None when there is nothing to share."""
    found = prefix_span(doc, chars)
    return None if found is None else found[0]


def prefix_span(doc: dict[str, Any], chars: int) -> tuple[bytes, int] | None:
    """`prefix_key` and how many bytes of the request it covers."""
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
    shared = text[:chars]
    return hashlib.blake2b(shared, digest_size=16).digest(), len(shared)
