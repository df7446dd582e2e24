"""Members another program writes into the revoked set, on a real redis-server (its own
port): they are never read into a replica's cache (which keeps what it holds for the
process's life), never pushed back into Redis, and never hide a revocation Redis lost.

Found by attack: a process on the same Redis that added a 40 MB member to
`{owngate}:revoked` (a set member may be 512 MB), bumped the version, then deleted it,
five times over, left 200 MB cached in every replica for good (RSS past 1 GB) and made
each sync read it over the wire; after a FLUSHALL the replicas wrote it back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from gateway.state.redis_state import RedisKeys
from tests.helpers.redis_server import RedisServer, replicas
from tests.helpers.waiting import until_async

pytestmark = pytest.mark.redis

WAIT_S = 15.0
KEYS = RedisKeys("test")
REVOKED = "sha256:" + "ab" * 32
FOREIGN = [
    b"A" * (1 << 20),  # large: a replica must not take it in
    b"sha256:" + b"AB" * 32,  # a digest's length, not its alphabet
    b"sha256:" + b"ab" * 31,  # too short
    REVOKED.encode() + b"\n",
    b"\xff\xfe not text",
]


def _stored(raw: aioredis.Redis) -> Callable[[], Awaitable[bool]]:
    async def stored() -> bool:
        return bool(await raw.sismember(KEYS.revoked, REVOKED))

    return stored


def test_foreign_members_are_never_cached_nor_pushed_back(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        try:
            async with replicas(redis_server, "a") as (a,):
                await raw.sadd(KEYS.revoked, REVOKED, *FOREIGN)
                await raw.set(KEYS.revoked_version, "1")
                await until_async(lambda: a.is_revoked(REVOKED), "revocation read", timeout=WAIT_S)
                assert a.revocations == 1  # the digest only
                assert a.healthy, a.degraded_reason

                # Redis loses its data: the replica writes back what it knows, only that
                await raw.flushall()
                await until_async(_stored(raw), "pushed back", timeout=WAIT_S)
                assert await raw.smembers(KEYS.revoked) == {REVOKED.encode()}
        finally:
            await raw.aclose()

    asyncio.run(scenario())


def test_foreign_members_never_hide_a_lost_revocation(redis_server: RedisServer) -> None:
    """Redis lost the revocation and holds as many foreign members as the replica knows
    digests, its version unmoved: counts alike, the revocation is still written back (a
    resync, every lease, reads the set whatever its version and size), and a replica
    started afterwards refuses the key."""

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        try:
            async with replicas(redis_server, "a", "c") as (a, c):
                assert await c.revoke_key(REVOKED)
                await until_async(lambda: a.is_revoked(REVOKED), "seen by a", timeout=WAIT_S)
                await c.close()  # a alone knows it, and has read the set's version
                async with raw.pipeline(transaction=True) as swap:
                    swap.delete(KEYS.revoked)
                    swap.sadd(KEYS.revoked, FOREIGN[0])
                    await swap.execute()
                await until_async(_stored(raw), "pushed back", timeout=WAIT_S)
                async with replicas(redis_server, "b") as (b,):
                    assert b.is_revoked(REVOKED)
        finally:
            await raw.aclose()

    asyncio.run(scenario())
