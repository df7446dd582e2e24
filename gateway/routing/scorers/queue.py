"""The queue scorer: room for one more request.

    queue = 1 - min(1, demand / (2 * slots))

1 when idle, 0.5 at capacity, 0 at twice capacity. Inputs: demand and slots from the
load model (gateway/routing/load.py: every replica's in-flight count, the scraped
running + waiting, the configured or scraped slot count). Config: the weight
`routing.*.weights.queue` (default 1.0), `backends[].capacity.max_concurrency`.
"""

from __future__ import annotations

__all__ = ["queue_score"]


def queue_score(demand: float, slots: float) -> float:
    busy = demand / (2.0 * slots)
    return 0.0 if busy >= 1.0 else 1.0 - busy
