"""A restore after Redis lost its data runs in bounded batches (`lua.RESTORE`).

Before, one script put back every tenant's budget at once: Redis served no one else for
about 22 ms per 1,000 tenants (1.07 s at 50,000). Now a replica sends at most
`restore_batch` rate keys a call, and `{prefix}:restored` records how far it got, so a
batch sent again (its reply lost) is not added twice, a run cut off half-way claims only
what it added, and two replicas restoring at once each add their own part exactly once.
Calls and keys are counted here, never timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.state import TenantLimits
from gateway.state.redis_keys import RedisKeys, text
from gateway.state.redis_state import RedisState
from tests.helpers.redis_server import RedisServer, replica, replicas
from tests.helpers.waiting import until_async

pytestmark = pytest.mark.redis

# one request: 30 s of the budget (two fit in its minute), so a loaded machine (the
# spending alone took over 10 s at load 20) does not age a budget out of the ranges below
LIMITS = TenantLimits(requests_per_minute=2)
KEYS = RedisKeys("test")
FIXED = 3  # RESTORE's keys before the rate keys: leases, epoch, restored
BATCH = 256  # the most rate keys a RESTORE call sends by default (docs/state.md)

Script = Callable[..., Awaitable[Any]]


def _restoring(reply: Any) -> bool:
    """A RESTORE reply of a call that put budgets back (not: the lease was live)."""
    return int(reply[0]) in (1, 2)


def _record(state: RedisState, calls: list[list[str]]) -> None:
    """Record the rate keys of each RESTORE call of `state` that put budgets back."""
    real: Script = state._restore_run._script

    async def recorded(*, keys: list[str], args: list[str | int]) -> Any:
        reply = await real(keys=keys, args=args)
        if _restoring(reply):
            calls.append(keys[FIXED:])
        return reply

    state._restore_run._script = recorded  # type: ignore[assignment]


async def _ahead_s(raw: aioredis.Redis, tenants: list[str]) -> list[float]:
    """How far each tenant's requests budget runs ahead of Redis's clock (s; 0 none)."""
    seconds, micros = await raw.time()
    now = seconds * 1_000_000 + micros
    out: list[float] = []
    for start in range(0, len(tenants), 1000):
        part = tenants[start : start + 1000]
        values = await raw.mget([KEYS.requests(t) for t in part])
        out += [0.0 if v is None else (int(v) - now) / 1e6 for v in values]
    return out


async def _spend(states: list[RedisState], tenants: list[str]) -> None:
    """One request of each tenant through each replica (30 s of budget each)."""
    for state in states:
        for tenant in tenants:
            await state.acquire(tenant, LIMITS)


def test_a_restore_of_20000_tenants_is_many_bounded_calls(redis_server: RedisServer) -> None:
    """20,000 tenants admitted while Redis was away go back in calls of at most
    `restore_batch` keys, each key once and each budget whole (was one call of 20,000)."""
    tenants = [f"t{i}" for i in range(20_000)]

    async def scenario() -> None:
        redis_server.stop()
        state = replica(redis_server, "replica-a")
        calls: list[list[str]] = []
        try:
            await state.start()
            assert not state.healthy
            await _spend([state], tenants)  # decided locally: Redis is away
            _record(state, calls)
            redis_server.start()  # empty
            # healthy: a HEARTBEAT renewed the lease, after the restore (same sync)
            await until_async(lambda: state.healthy, "the replica on Redis", timeout=60)
            assert max(len(keys) for keys in calls) <= BATCH  # was 20,000
            assert len(calls) >= len(tenants) // BATCH
            sent = [key for keys in calls for key in keys]
            assert sorted(sent) == sorted(KEYS.requests(t) for t in tenants)  # each once
            raw = aioredis.Redis.from_url(redis_server.url)
            try:
                ahead = await _ahead_s(raw, tenants)
            finally:
                await raw.aclose()
            assert all(10 < s <= 30 for s in ahead), (min(ahead), max(ahead))
        finally:
            await state.close()

    asyncio.run(scenario())


def test_a_run_cut_off_by_failed_calls_is_finished_once(redis_server: RedisServer) -> None:
    """A batch whose reply was lost (Redis ran it) and one that never reached Redis: the
    next sync goes on from there, and no tenant is charged twice or left out."""
    tenants = [f"t{i}" for i in range(1000)]

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        async with replicas(redis_server, "replica-a") as (state,):
            state.restore_batch = 100
            await _spend([state], tenants)
            real = state._restore_run._script
            calls: list[list[str]] = []  # the batches Redis ran
            failed: list[str] = []

            async def failing(*, keys: list[str], args: list[str | int]) -> Any:
                if len(calls) == 6 and "unsent" not in failed:
                    failed.append("unsent")
                    raise ConnectionError("never sent")
                reply = await real(keys=keys, args=args)
                if _restoring(reply):
                    calls.append(keys[FIXED:])
                    if len(calls) == 3 and "lost" not in failed:
                        failed.append("lost")
                        raise TimeoutError("the reply was lost")
                return reply

            state._restore_run._script = failing  # type: ignore[assignment]
            await raw.flushall()
            await until_async(
                lambda: state.healthy and state.status().restores == 1,
                "the replica back on Redis, its budgets restored",
                timeout=60,
            )
            assert failed == ["lost", "unsent"]
            assert max(len(keys) for keys in calls) <= 100  # was one call of 1,000
            assert calls[3] == calls[2]  # the batch whose reply was lost, sent again
            assert len(calls) == 11
            ahead = await _ahead_s(raw, tenants)
            # 30 s each, once: the batch sent twice was not added twice (60 s)
            assert all(10 < s <= 30 for s in ahead), (min(ahead), max(ahead))
        await raw.aclose()

    asyncio.run(scenario())


def test_a_replica_dying_half_way_claims_only_what_it_added(
    redis_server: RedisServer,
) -> None:
    """Replica a dies after two batches of its restore; replica b restores all of its
    own part meanwhile. The tenants of a's two batches hold both parts, the others b's
    (a's is gone with it, as with any replica that exits), and `restored` says a added
    two batches, not its whole run."""
    tenants = [f"t{i}" for i in range(600)]
    batch = 100

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        async with replicas(redis_server, "replica-a", "replica-b") as (a, b):
            a.restore_batch = b.restore_batch = batch
            await _spend([a, b], tenants)
            real = a._restore_run._script
            a_calls: list[list[str]] = []
            dying = asyncio.Event()

            async def dies(*, keys: list[str], args: list[str | int]) -> Any:
                if len(a_calls) == 2:  # two batches in: the third never goes
                    dying.set()
                    await asyncio.Event().wait()  # until the replica is gone
                reply = await real(keys=keys, args=args)
                if _restoring(reply):
                    a_calls.append(keys[FIXED:])
                return reply

            a._restore_run._script = dies  # type: ignore[assignment]
            b_calls: list[list[str]] = []
            _record(b, b_calls)
            await raw.flushall()
            await asyncio.wait_for(dying.wait(), timeout=60)
            await a.close(deregister=False)  # as if killed: nothing more from it
            await until_async(
                lambda: b.healthy and b.status().restores == 1, "b's restore", timeout=60
            )
            assert max(len(keys) for keys in b_calls) <= batch
            added = {key for keys in a_calls for key in keys}
            assert len(added) == 2 * batch
            ahead = await _ahead_s(raw, tenants)
            for tenant, s in zip(tenants, ahead, strict=True):
                if KEYS.requests(tenant) in added:
                    assert 40 < s <= 60, (tenant, s)  # a's part and b's
                else:
                    assert 10 < s <= 30, (tenant, s)  # b's alone
            mark = text(await raw.hget(KEYS.restored, "replica-a") or b"")
            epoch = text(await raw.get(KEYS.epoch) or b"")
            assert mark.startswith(epoch + "|") and mark.endswith(f"|{2 * batch}"), mark
        await raw.aclose()

    asyncio.run(scenario())


def test_two_replicas_restoring_at_once_add_each_part_once(
    redis_server: RedisServer,
) -> None:
    """Replicas a and b restore the same tenants in alternating batches (a call of one
    between two of the other, forced): every budget holds both parts, none twice."""
    tenants = [f"t{i}" for i in range(500)]
    batch = 100

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        async with replicas(redis_server, "replica-a", "replica-b") as (a, b):
            a.restore_batch = b.restore_batch = batch
            await _spend([a, b], tenants)
            order: list[str] = []
            turn = {"replica-a": asyncio.Event(), "replica-b": asyncio.Event()}

            def alternate(state: RedisState, other: str) -> None:
                real = state._restore_run._script
                me = state.replica_id

                async def call(*, keys: list[str], args: list[str | int]) -> Any:
                    if order:  # after a batch of its own: the other's first (bounded:
                        # the other may have finished its run, or not yet seen the loss;
                        # both replicas sync on this loop, so 5 s is not a race on a busy
                        # machine, and it is waited only where the other has no call left)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(turn[me].wait(), timeout=5)
                    turn[me].clear()
                    reply = await real(keys=keys, args=args)
                    if _restoring(reply):
                        order.append(me)
                        turn[other].set()
                    return reply

                state._restore_run._script = call  # type: ignore[assignment]

            alternate(a, "replica-b")
            alternate(b, "replica-a")
            await raw.flushall()
            await until_async(
                lambda: all(s.healthy and s.status().restores == 1 for s in (a, b)),
                "both replicas' restores",
                timeout=60,
            )
            switches = sum(1 for x, y in itertools.pairwise(order) if x != y)
            assert switches >= 4, order  # the runs did interleave
            ahead = await _ahead_s(raw, tenants)
            assert all(40 < s <= 60 for s in ahead), (min(ahead), max(ahead))
        await raw.aclose()

    asyncio.run(scenario())


def test_redis_losing_its_data_again_mid_run_starts_the_run_over(
    redis_server: RedisServer,
) -> None:
    """Redis loses its data again after two batches of a restore: those two batches
    went with it, so the run starts over under the new epoch (every budget back once),
    rather than going on and leaving the first two batches' tenants a whole budget."""
    tenants = [f"t{i}" for i in range(500)]

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        async with replicas(redis_server, "replica-a") as (state,):
            state.restore_batch = 100
            await _spend([state], tenants)
            real = state._restore_run._script
            firsts: list[int] = []  # the run position of each batch Redis put back
            flushed: list[bytes | str | None] = []

            async def flushing(*, keys: list[str], args: list[str | int]) -> Any:
                if len(firsts) == 2 and not flushed:
                    flushed.append(await raw.get(KEYS.epoch))
                    await raw.flushall()
                reply = await real(keys=keys, args=args)
                if _restoring(reply):
                    firsts.append(int(args[5]))
                return reply

            state._restore_run._script = flushing  # type: ignore[assignment]
            await raw.flushall()
            await until_async(
                lambda: state.healthy and state.status().restores == 1,
                "the replica back on Redis, its budgets restored",
                timeout=60,
            )
            assert firsts == [0, 100, 0, 100, 200, 300, 400], firsts
            assert flushed and await raw.get(KEYS.epoch) not in (None, flushed[0])
            ahead = await _ahead_s(raw, tenants)
            assert all(10 < s <= 30 for s in ahead), (min(ahead), max(ahead))
        await raw.aclose()

    asyncio.run(scenario())


def test_redis_losing_its_data_after_the_last_batch_restores_again(
    redis_server: RedisServer,
) -> None:
    """Redis loses its data again after a run's last batch, before the HEARTBEAT that
    renews the lease: that HEARTBEAT must not take the lease in the empty Redis (every
    budget of the run would be gone, and the next restore would find the lease live and
    put nothing back); the replica restores again into the new epoch first."""
    tenants = [f"t{i}" for i in range(300)]

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        async with replicas(redis_server, "replica-a") as (state,):
            state.restore_batch = 100
            await _spend([state], tenants)
            real = state._restore_run._script
            flushed: list[int] = []

            async def flushing(*, keys: list[str], args: list[str | int]) -> Any:
                reply = await real(keys=keys, args=args)
                if _restoring(reply) and int(args[5]) == 200 and not flushed:
                    flushed.append(int(args[5]))  # the run's last batch: then data lost
                    await raw.flushall()
                return reply

            state._restore_run._script = flushing  # type: ignore[assignment]
            await raw.flushall()

            async def leased_after_flush() -> bool:
                return bool(flushed) and bool(await raw.hexists(KEYS.leases, "replica-a"))

            await until_async(leased_after_flush, "a lease after the second loss", timeout=60)
            ahead = await _ahead_s(raw, tenants)
            # 30 s each, once, in the Redis that lost its data the second time
            assert all(10 < s <= 30 for s in ahead), (min(ahead), max(ahead))
        await raw.aclose()

    asyncio.run(scenario())
