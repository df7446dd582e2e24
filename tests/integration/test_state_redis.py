"""RedisState against a real redis-server started here (its own port, no persistence):
two replicas share limits, in-flight counts and revocations; a crashed replica's counts
expire with its lease; Redis going away degrades to local state and comes back."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.state import RateLimited, SharedState, TenantLimits, TenantUse, create_state
from gateway.state.redis_state import RedisKeys
from tests.helpers.net import free_port
from tests.helpers.redis_server import RedisServer, replica, replicas
from tests.helpers.waiting import until_async

pytestmark = pytest.mark.redis

CRASH_LEASE_TTL_S = 0.6  # the crash test waits this out
WAIT_S = 15.0  # how long a replica may take to see what another did


async def slot_owners(server: RedisServer, tenant: str) -> list[str]:
    """Whose concurrency slots Redis holds for the tenant: one replica id per slot."""
    raw = aioredis.Redis.from_url(server.url)
    try:
        fields = await raw.hkeys(RedisKeys("test").slots(tenant))
    finally:
        await raw.aclose()
    names = (f.decode() if isinstance(f, bytes) else f for f in fields)
    return sorted(name.partition("|")[0] for name in names)


async def eventually_owners(server: RedisServer, tenant: str, owners: list[str]) -> None:
    """Wait (bounded) until Redis holds exactly `owners`' slots for the tenant."""
    found: list[str] = []

    async def settled() -> bool:
        found[:] = await slot_owners(server, tenant)
        return found == owners

    what = f"slots of {tenant}: expected {owners}"
    await until_async(settled, what, timeout=WAIT_S, interval=0.02, detail=lambda: found)


async def admitted_count(calls: list[Awaitable[object]]) -> tuple[int, list[RateLimited]]:
    results = await asyncio.gather(*calls, return_exceptions=True)
    refused = [r for r in results if isinstance(r, RateLimited)]
    others = [r for r in results if isinstance(r, BaseException) and r not in refused]
    assert not others, others
    return len(results) - len(refused), refused


def test_global_rpm_holds_across_replicas(redis_server: RedisServer) -> None:
    limits = TenantLimits(requests_per_minute=120)

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            started = time.monotonic()
            total = 0
            for _ in range(4):  # bounded: 4 rounds of 100 concurrent attempts
                calls = [(a if i % 2 else b).acquire("acme", limits) for i in range(100)]
                admitted, refused = await admitted_count(list(calls))
                total += admitted
            elapsed = time.monotonic() - started
            # GCRA: a burst of 120, then 2 a second, whichever replica asks
            assert 120 <= total <= 120 + 2 * elapsed + 1, (total, elapsed)
            assert refused and all(r.limit == "requests_per_minute" for r in refused)
            assert all(0 < r.retry_after_s <= 0.5 for r in refused)
            assert a.status().fallbacks == b.status().fallbacks == 0

    asyncio.run(scenario())


def test_concurrency_and_tokens_are_global(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            limits = TenantLimits(concurrent=5)
            calls = [(a if i % 2 else b).acquire("acme", limits) for i in range(20)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            held = [r for r in results if not isinstance(r, BaseException)]
            assert len(held) == 5
            for admission in held[:2]:
                await admission.release()
            await b.acquire("acme", limits)
            await b.acquire("acme", limits)
            with pytest.raises(RateLimited) as caught:
                await a.acquire("acme", limits)
            assert caught.value.limit == "concurrent"
            assert caught.value.retry_after_header == b"1"

            tokens = TenantLimits(tokens_per_minute=1000)
            first = await a.acquire("beta", tokens)
            released = time.monotonic()
            await first.release(1200)  # 72 s of budget used
            with pytest.raises(RateLimited) as caught:
                await b.acquire("beta", tokens)
            assert caught.value.limit == "tokens_per_minute"
            waited = time.monotonic() - released  # the budget refilled meanwhile
            assert 12.0 - waited - 1e-6 <= caught.value.retry_after_s <= 12.0 + 1e-6

    asyncio.run(scenario())


def test_inflight_counts_converge(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            seen_by_b: list[dict[str, int]] = []  # what routing on b is told, sync by sync
            b.watch_peers(lambda others: seen_by_b.append(dict(others)))
            for _ in range(3):
                a.backend_started("gpu-1")
            b.backend_started("gpu-1")
            b.backend_started("gpu-2")
            assert (a.inflight("gpu-1"), a.local_inflight("gpu-1")) == (3, 3)
            await until_async(
                lambda: a.inflight("gpu-1") == b.inflight("gpu-1") == 4, "sum 4", timeout=WAIT_S
            )
            await until_async(
                lambda: a.inflight("gpu-2") == 1, "b's gpu-2 seen by a", timeout=WAIT_S
            )
            assert seen_by_b[-1] == {"gpu-1": 3}  # a's only: b counts its own exactly
            for _ in range(3):
                a.backend_finished("gpu-1")
            await until_async(
                lambda: b.inflight("gpu-1") == 1 == a.inflight("gpu-1"), "sum 1", timeout=WAIT_S
            )
            assert seen_by_b[-1] == {}
            assert all(x != y for x, y in itertools.pairwise(seen_by_b))  # changes only
            assert a.status().replicas == 2

    asyncio.run(scenario())


def test_crashed_replica_counts_expire_with_its_lease(redis_server: RedisServer) -> None:
    limits = TenantLimits(concurrent=3)

    async def scenario() -> None:
        async with replicas(redis_server, "survivor") as (b,):
            a = replica(redis_server, "crasher", lease_ttl_s=CRASH_LEASE_TTL_S)
            await a.start()
            for _ in range(4):
                a.backend_started("gpu-1")
            await a.acquire("acme", limits)
            await a.acquire("acme", limits)
            await until_async(
                lambda: b.inflight("gpu-1") == 4, "crasher's in-flight seen", timeout=WAIT_S
            )
            await a.close(deregister=False)  # a crash: no goodbye, the lease just stops
            crashed = time.monotonic()
            await b.acquire("acme", limits)
            with pytest.raises(RateLimited):
                await b.acquire("acme", limits)  # the crasher's 2 slots still count
            assert b.inflight("gpu-1") == 4
            await until_async(
                lambda: b.inflight("gpu-1") == 0, "lease expiry", timeout=CRASH_LEASE_TTL_S * 5
            )
            assert time.monotonic() - crashed >= CRASH_LEASE_TTL_S * 0.5
            await b.acquire("acme", limits)
            await b.acquire("acme", limits)  # the crasher's slots are free again
            assert b.status().replicas == 1

    asyncio.run(scenario())


def test_clean_shutdown_frees_counts_at_once(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        async with replicas(redis_server, "stays") as (b,):
            a = replica(redis_server, "leaves", lease_ttl_s=30.0)
            await a.start()
            a.backend_started("gpu-1")
            await until_async(lambda: b.inflight("gpu-1") == 1, "seen", timeout=WAIT_S)
            await a.close()
            took = await until_async(lambda: b.inflight("gpu-1") == 0, "deregistered", timeout=20.0)
            assert took < 30.0  # not the 30 s lease running out: the goodbye freed them

    asyncio.run(scenario())


def test_redis_down_falls_back_to_local_state_and_recovers(redis_server: RedisServer) -> None:
    limits = TenantLimits(requests_per_minute=6000, concurrent=50)

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b", timeout_s=0.05) as (a, b):
            peers_of_b: list[dict[str, int]] = []
            b.watch_peers(lambda others: peers_of_b.append(dict(others)))
            a.backend_started("gpu-1")
            held = [await a.acquire("acme", limits), await a.acquire("acme", limits)]
            await until_async(lambda: b.inflight("gpu-1") == 1, "in-flight shared", timeout=WAIT_S)
            assert peers_of_b == [{"gpu-1": 1}]

            slowest = 0.0
            outage = False
            for step in range(60):  # bounded load while Redis goes away
                if step == 10:
                    redis_server.stop()
                    outage = True
                state = a if step % 2 else b
                started = time.monotonic()
                admission = await state.acquire("acme", limits)  # never raises for Redis
                slowest = max(slowest, time.monotonic() - started)
                await admission.release(10)
                await asyncio.sleep(0.005)
            # The 50 ms timeout, with slack for a busy machine: far below a hang.
            assert outage and slowest < 2.0
            await until_async(lambda: not a.healthy and not b.healthy, "degraded", timeout=WAIT_S)
            reason = a.degraded_reason
            assert reason is not None and reason.startswith("redis ")
            assert a.status().fallbacks > 0 and a.status().errors > 0
            assert b.inflight("gpu-1") == 0  # only local counts while Redis is away
            assert peers_of_b[-1] == {}  # and routing was told so
            local = await b.acquire("acme", limits)
            assert not local.shared
            await local.release()

            redis_server.start()  # same port, empty: no persistence
            await until_async(lambda: a.healthy and b.healthy, "recovered", timeout=WAIT_S)
            assert a.degraded_reason is None
            await until_async(
                lambda: b.inflight("gpu-1") == 1, "in-flight shared again", timeout=WAIT_S
            )
            assert peers_of_b[-1] == {"gpu-1": 1}
            admission = await a.acquire("acme", limits)
            assert admission.shared
            await admission.release()
            # the slots a held through the outage were written back on recovery
            await eventually_owners(redis_server, "acme", ["a", "a"])
            for admission in held:
                await admission.release()
            assert await slot_owners(redis_server, "acme") == []

    asyncio.run(scenario())


def test_lost_redis_data_is_rewritten_by_the_next_sync(redis_server: RedisServer) -> None:
    limits = TenantLimits(concurrent=2)

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            await a.acquire("acme", limits)
            raw = aioredis.Redis.from_url(redis_server.url)
            try:
                await raw.flushall()
            finally:
                await raw.aclose()
            await eventually_owners(redis_server, "acme", ["a"])
            await b.acquire("acme", limits)
            with pytest.raises(RateLimited):
                await b.acquire("acme", limits)

    asyncio.run(scenario())


def test_slow_redis_times_out_and_heals(redis_server: RedisServer) -> None:
    """Redis stops answering for a while (CLIENT PAUSE): calls give up after the 50 ms
    timeout and go local; afterwards the resync leaves Redis with exactly the slots
    this replica holds, whatever happened to the calls that timed out."""
    limits = TenantLimits(concurrent=10)

    async def scenario() -> None:
        async with replicas(redis_server, "a", timeout_s=0.05) as (a,):
            first = await a.acquire("acme", limits)
            await eventually_owners(redis_server, "acme", ["a"])
            raw = aioredis.Redis.from_url(redis_server.url)
            try:
                await raw.client_pause(3000, all=True)  # far past the 2 s bound below
            finally:
                await raw.aclose()
            started = time.monotonic()
            await first.release()  # times out: did Redis drop the slot? unknown
            local = await a.acquire("acme", limits)
            # Two 50 ms timeouts, with slack for a busy machine (it was 0.3 s, which a
            # descheduled thread or a full collection can take alone): below the pause.
            assert time.monotonic() - started < 2.0
            assert not a.healthy and not local.shared
            await until_async(lambda: a.healthy, "recovered after the pause", timeout=WAIT_S)
            await eventually_owners(redis_server, "acme", ["a"])  # the local one only
            await local.release()
            await eventually_owners(redis_server, "acme", [])

    asyncio.run(scenario())


def test_a_stray_slot_of_this_replica_is_removed_by_a_resync(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        a = replica(redis_server, "a", lease_ttl_s=CRASH_LEASE_TTL_S)  # resyncs every 0.6 s
        await a.start()
        try:
            held = await a.acquire("acme", TenantLimits(concurrent=5))
            raw = aioredis.Redis.from_url(redis_server.url)
            try:
                await raw.hset(RedisKeys("test").slots("acme"), "a|999999", 1)
            finally:
                await raw.aclose()
            assert await slot_owners(redis_server, "acme") == ["a", "a"]
            await eventually_owners(redis_server, "acme", ["a"])  # the periodic resync
            await held.release()
            assert await slot_owners(redis_server, "acme") == []
        finally:
            await a.close()

    asyncio.run(scenario())


def test_revocations_reach_every_replica(redis_server: RedisServer) -> None:
    first, second = "sha256:" + "a" * 64, "sha256:" + "b" * 64

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            assert await a.revoke_key(first)
            assert a.is_revoked(first)
            await until_async(lambda: b.is_revoked(first), "revocation seen by b", timeout=WAIT_S)

            redis_server.stop()
            await until_async(lambda: not a.healthy, "degraded", timeout=WAIT_S)
            assert not await a.revoke_key(second)  # applied here, queued for Redis
            assert a.is_revoked(second) and a.status().pending_revocations == 1
            assert b.is_revoked(first)  # what was seen stays enforced

            redis_server.start()  # empty: the revocations went with the old process
            await until_async(
                lambda: b.is_revoked(second), "queued revocation delivered", timeout=WAIT_S
            )
            assert a.status().pending_revocations == 0
        async with replicas(redis_server, "late") as (late,):
            await until_async(
                lambda: late.is_revoked(first) and late.is_revoked(second),
                "re-stored",
                timeout=30.0,
            )

    asyncio.run(scenario())


def test_unreachable_at_start_is_degraded_not_fatal(tmp_path: Path) -> None:
    async def scenario() -> None:
        state: SharedState = create_state(
            "redis", f"redis://127.0.0.1:{free_port()}/0", replica_id="alone", timeout_s=0.05
        )
        await state.start()
        try:
            assert not state.healthy
            assert state.degraded_reason is not None
            admission = await state.acquire("acme", TenantLimits(concurrent=1))
            with pytest.raises(RateLimited):
                await state.acquire("acme", TenantLimits(concurrent=1))
            await admission.release()
        finally:
            await state.close()

    asyncio.run(scenario())


def test_tenant_use_is_this_replica_s_share(redis_server: RedisServer) -> None:
    """`tenant_use` reads the replica's own ledger: what it admitted and holds."""
    limits = TenantLimits(requests_per_minute=6, concurrent=10)  # 10 s a request: no drift

    async def scenario() -> None:
        async with replicas(redis_server, "a") as (a,):
            held = [await a.acquire("acme", limits) for _ in range(3)]
            use = a.tenant_use("acme", limits)
            assert (use.inflight, use.requests, use.tokens) == (3, 3, None)
            await held[0].release()
            assert a.tenant_use("acme", limits).inflight == 2
            assert a.tenant_use("other", limits) == TenantUse(inflight=0, requests=0, tokens=None)

    asyncio.run(scenario())
