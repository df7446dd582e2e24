"""How busy a backend is: the one load model the queue scorer and the saturation check read.

Inputs: the backend's `BackendState` (this replica's `inflight`, the other replicas'
`peer_inflight` as of the last shared-state sync, `capacity.max_concurrency` from
gateway.yaml, llama.cpp's `learned_slots`) and the scraper's fresh `BackendLoad`
(`running`, `waiting`, `slots_total`, and `gateway_inflight`: the gateway's in-flight
count when that scrape was sent), or None when no fresh scrape exists.

- `demand_and_slots` (the queue scorer, gateway/routing/scorers/queue.py, and the
  bounded-load rule of affinity and prefill):
  - demand = max(I, running + waiting + (I - gateway_inflight)), where I is every
    replica's in-flight count; the correction adds what the gateway sent since the
    scrape (or takes off what finished), so a burst shows at once and a drained queue
    does not linger. Without scraped counts, demand = I.
  - slots = `capacity.max_concurrency`, else the scraped `slots_total`, else the
    scraped running count when a queue is reported, else 8; at least 1.
- `queue_per_slot` (the saturation check: `routing.*.queue.threshold` and a policy's
  `saturation_threshold`): waiting requests per concurrency slot, the larger of the
  scraped `waiting` and I - capacity (the fast signal, ahead of the next scrape), over
  the capacity (configured, else learned, else the scraped running count). Unknown
  capacity: 0, never saturated.
- `LOAD_SLACK`: how much busier (demand per slot) than the least loaded candidate a
  backend may be and still count as lightly loaded (affinity and prefill only count
  among those, so neither builds a queue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.routing.registry import BackendState
    from gateway.routing.signals import BackendLoad

__all__ = ["DEFAULT_SLOTS", "LOAD_SLACK", "demand_and_slots", "queue_per_slot"]

DEFAULT_SLOTS = 8
LOAD_SLACK = 1 / 16


def demand_and_slots(backend: BackendState, load: BackendLoad | None) -> tuple[float, float]:
    """The backend's demand (requests wanting a slot) and its slot count (at least 1)."""
    demand = float(backend.inflight + backend.peer_inflight)
    scraped_slots = None
    if load is not None:
        running, waiting = load.running, load.waiting
        if running is not None or waiting is not None:
            scraped = (running or 0.0) + (waiting or 0.0)
            if load.gateway_inflight is not None:
                scraped += demand - load.gateway_inflight
            if scraped > demand:
                demand = scraped
        scraped_slots = load.slots_total or (running if waiting else None)
    slots = float(backend.max_concurrency or scraped_slots or DEFAULT_SLOTS)
    return demand, slots if slots > 1.0 else 1.0


def queue_per_slot(backend: BackendState, load: BackendLoad | None) -> float:
    """Waiting requests per concurrency slot, every replica's requests counted."""
    capacity = backend.max_concurrency or backend.learned_slots
    queued = 0.0
    slots = float(capacity or 0)
    if load is not None and load.waiting is not None:
        queued = load.waiting
        slots = slots or (load.running or 0.0)
    if capacity:
        queued = max(queued, float(backend.global_inflight - capacity))
    return queued / slots if slots else 0.0
