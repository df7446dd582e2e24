"""A worker of `serve --workers N` started again after it died (gateway/state/memory.py,
`restarted`): its memory state starts each tenant's part of every limit spent, as if the
dead worker had used it all just now, and refills it from there. A first start, and a
process that is no worker, start with full budgets as before."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway.state import (
    RESTARTED_ENV,
    WORKERS_ENV,
    MemoryState,
    RateLimited,
    TenantLimits,
    create_state,
    restarted_worker,
)
from gateway.worker_identity import INDEX_ENV, RUNTIME_ENV
from tests.helpers.clock import FakeClock

WORKER = {RUNTIME_ENV: "/run/owngate/workers", WORKERS_ENV: "2", INDEX_ENV: "2"}


def _admitted(state: MemoryState, limits: TenantLimits, tries: int) -> int:
    async def run() -> int:
        count = 0
        for _ in range(tries):
            with contextlib.suppress(RateLimited):
                admission = await state.acquire("acme", limits)
                await admission.release(0)
                count += 1
        return count

    return asyncio.run(run())


def test_a_restarted_workers_requests_part_starts_spent_and_refills() -> None:
    """`requests_per_minute: 10` over 2 workers: a part of 5, one every 12 s. A first
    start admits 5 at once; a restarted worker admits none then, one 12 s later, its
    whole part a minute later (before: 5 at once, a fresh part for each death)."""
    limits = TenantLimits(requests_per_minute=10)
    clock = FakeClock()
    fresh = MemoryState(clock=clock, parts=2, index=2)
    restarted = MemoryState(clock=clock, parts=2, index=2, restarted=True)
    assert _admitted(fresh, limits, 20) == 5
    assert _admitted(restarted, limits, 20) == 0
    clock.now += 12
    assert _admitted(restarted, limits, 20) == 1
    clock.now += 60
    assert _admitted(restarted, limits, 20) == 5


def test_a_restarted_workers_token_part_starts_spent_and_refills() -> None:
    """`tokens_per_minute: 600` over 2 workers: a part of 300, refilling 5 a second. A
    restarted worker admits nothing at once; a reservation of 100 tokens fits 20 s later
    (100 of 300 refilled), not 19 s later (before: 300 at once)."""
    limits = TenantLimits(tokens_per_minute=600)
    clock = FakeClock()
    restarted = MemoryState(clock=clock, parts=2, index=1, restarted=True)

    async def reserve() -> None:
        admission = await restarted.acquire("acme", limits)
        try:
            await admission.reserve(100)
        finally:
            await admission.release(0)

    for wait_s, refused_for_s in ((0, 0.0), (19, 1.0)):
        clock.now += wait_s
        with pytest.raises(RateLimited) as refused:
            asyncio.run(reserve())
        assert refused.value.limit == "tokens_per_minute"
        assert refused.value.retry_after_s == pytest.approx(refused_for_s, abs=0.01)
    clock.now += 1
    asyncio.run(reserve())


def test_concurrency_and_unlimited_tenants_are_not_held_back() -> None:
    """What died with the worker was its requests in flight: its concurrency part is
    free; a tenant without limits is not limited."""
    clock = FakeClock()
    restarted = MemoryState(clock=clock, parts=2, index=1, restarted=True)
    assert _admitted(restarted, TenantLimits(concurrent=4), 3) == 3
    assert _admitted(restarted, TenantLimits(), 3) == 3


def test_only_a_worker_the_supervisor_restarted_starts_spent() -> None:
    assert restarted_worker({**WORKER, RESTARTED_ENV: "1"})
    assert not restarted_worker(WORKER)  # a first start
    assert not restarted_worker({RESTARTED_ENV: "1"})  # no worker: one process
    assert not restarted_worker({**WORKER, WORKERS_ENV: "1", RESTARTED_ENV: "1"})
    limits = TenantLimits(requests_per_minute=10)
    one = create_state("memory", clock=FakeClock(), restarted=True)  # parts=1: unchanged
    assert isinstance(one, MemoryState) and _admitted(one, limits, 20) == 10
