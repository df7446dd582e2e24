"""RedisState against hostile or broken data in a real redis-server (its own port): what
Redis holds or answers must never stop revocations from reaching a replica, and no
usage number a backend reports may break the shared token accounting."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from gateway.state import RateLimited, TenantLimits
from gateway.state.redis_state import RedisKeys
from tests.helpers.redis_server import RedisServer, replicas
from tests.helpers.waiting import until_async

pytestmark = pytest.mark.redis

WAIT_S = 15.0
KEYS = RedisKeys("test")
HUGE = b"g" * (1 << 20)  # a backend name no replica writes


async def plant_garbage(server: RedisServer, where: str) -> None:
    """Bytes that are not UTF-8 where a replica reads names, then a version bump so that
    every replica reads the revoked set again."""
    raw = aioredis.Redis.from_url(server.url)
    try:
        if where == "revoked-member":
            await raw.sadd(KEYS.revoked, b"\xff\xfe not text")
        else:  # a backend of the live replica a, as another program might write it
            await raw.hset(KEYS.inflight, b"a|\xff", b"1")
        await raw.set(KEYS.revoked_version, "1")
    finally:
        await raw.aclose()


@pytest.mark.parametrize("where", ["revoked-member", "inflight-field"])
def test_garbage_in_redis_never_stops_revocations(redis_server: RedisServer, where: str) -> None:
    """Bytes in Redis that are no text must not end the sync loop: replica b would then
    never see another revocation (and never heal). The revocation made on a after the
    garbage appeared still reaches b, and both stay healthy."""
    revoked = "sha256:" + "c" * 64

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            await plant_garbage(redis_server, where)
            assert await a.revoke_key(revoked)
            await until_async(
                lambda: b.is_revoked(revoked),
                "revocation seen by b",
                timeout=WAIT_S,
                detail=lambda: b.status(),
            )
            assert a.healthy and b.healthy, (a.status(), b.status())

    asyncio.run(scenario())


@pytest.mark.parametrize("tokens", [2**53, 10**15])
def test_huge_reported_usage_is_charged_on_every_replica(
    redis_server: RedisServer, tokens: int
) -> None:
    """A backend may report up to 2**53 tokens (the most a usage record holds). Charging
    them must not fail on Redis (which would leave the debt on one replica only and
    turn shared state degraded): the tenant is refused on the other replica too."""
    limits = TenantLimits(tokens_per_minute=1000)

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            admission = await a.acquire("acme", limits)
            await admission.release(tokens)
            assert a.healthy, a.status()
            assert a.status().errors == 0
            with pytest.raises(RateLimited) as caught:
                await b.acquire("acme", limits)
            assert caught.value.limit == "tokens_per_minute"
            assert caught.value.retry_after_s > 60.0

    asyncio.run(scenario())


FOREIGN_INFLIGHT = {
    "negative": (b"gpu", b"-1000000"),  # routing would send everything to gpu
    "no-number": (b"cpu", b"many"),  # the sync's script failed on it: degraded meanwhile
    "huge-name": (HUGE, b"1"),  # read over the wire at every sync
}


@pytest.mark.parametrize("kind", sorted(FOREIGN_INFLIGHT))
def test_foreign_inflight_counts_never_reach_routing(redis_server: RedisServer, kind: str) -> None:
    """Another program on the same Redis, with a lease of its own, writes an in-flight
    field no replica writes (a backend id is at most 63 bytes, a count a whole number
    >= 0). Replica a ignores it, stays healthy, and still counts replica b's requests."""
    backend, count = FOREIGN_INFLIGHT[kind]

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        try:
            async with replicas(redis_server, "a", "b") as (a, b):
                await raw.hset(KEYS.leases, "evil", "99999999999999999")
                await raw.hset(KEYS.inflight, b"evil|" + backend, count)
                b.backend_started("gpu")
                b.backend_started("gpu")
                await until_async(lambda: a.inflight("gpu") == 2, "b's count", timeout=WAIT_S)
                assert a.healthy, a.degraded_reason
                assert a.inflight(backend.decode()) == (2 if backend == b"gpu" else 0)
        finally:
            await raw.aclose()

    asyncio.run(scenario())
