"""Shared state: tenant limits, per-backend in-flight counters and key revocations.

One interface (`SharedState`), two implementations: `MemoryState` (the default, per
process) and `RedisState` (shared by every replica; redis-py is imported only when it
is configured). `create_state` picks one from the `state:` section of gateway.yaml.
See docs/state.md for what is shared, the Redis keys, and behaviour while Redis is away.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from gateway.state.memory import (
    RESTARTED_ENV,
    WORKERS_ENV,
    MemoryState,
    limit_copies,
    limit_part,
    restarted_worker,
    unsplittable,
)
from gateway.state.revocation_keeper import KeptRevocations
from gateway.state.revocation_list import RevocationListError
from gateway.state.types import (
    Admission,
    LimitName,
    PeersListener,
    RateLimited,
    SharedState,
    StateStatus,
    TenantLimits,
    TenantUse,
)

__all__ = [
    "RESTARTED_ENV",
    "WORKERS_ENV",
    "Admission",
    "LimitName",
    "MemoryState",
    "PeersListener",
    "RateLimited",
    "RevocationListError",
    "SharedState",
    "StateStatus",
    "TenantLimits",
    "TenantUse",
    "create_state",
    "limit_copies",
    "limit_part",
    "restarted_worker",
    "unsplittable",
]


def create_state(
    backend: Literal["memory", "redis"],
    url: str | None = None,
    *,
    replica_id: str | None = None,
    key_prefix: str = "owngate",
    timeout_s: float = 0.05,
    sync_interval_s: float = 0.1,
    lease_ttl_s: float = 5.0,
    max_connections: int = 16,
    clock: Callable[[], float] = time.monotonic,
    workers: int = 1,
    worker_index: int = 1,
    restarted: bool = False,
    revocations_file: Path | None = None,
) -> SharedState:
    """Build the configured state; nothing connects until `start()` (in the lifespan).

    Redis options: `timeout_s` bounds each request-path call (then local state decides),
    `sync_interval_s` paces the background sync, `lease_ttl_s` is how long a silent
    replica's counts still count, `max_connections` caps request calls in flight.
    `replica_id` must be unique among live replicas; the default is. `workers`: the
    processes of `serve --workers N` (`limit_copies`): each holds a memory state of its
    own that enforces part `worker_index` (`limit_part`) of every tenant limit, or counts
    as a replica on Redis from the start (a worker that never reached Redis splits each
    limit over them). `restarted`: a worker started again after it died; with memory
    state its parts start spent (`MemoryState`). `revocations_file`: this host's revoked
    keys list, read here (raises `RevocationListError`, a ValueError, when it cannot be:
    no state, no start) and enforced from the first request, Redis up or down."""
    kept = KeptRevocations(revocations_file) if revocations_file is not None else None
    if backend == "memory":
        return MemoryState(
            clock=clock, parts=workers, index=worker_index, restarted=restarted, kept=kept
        )
    if not url:
        raise ValueError("state backend 'redis' needs a url (redis://host:port/db)")
    # Imported here so that redis-py loads only when Redis is configured.
    from gateway.state.redis_state import RedisState

    return RedisState(
        url,
        workers=workers,
        replica_id=replica_id,
        key_prefix=key_prefix,
        timeout_s=timeout_s,
        sync_interval_s=sync_interval_s,
        lease_ttl_s=lease_ttl_s,
        max_connections=max_connections,
        clock=clock,
        kept=kept,
    )
