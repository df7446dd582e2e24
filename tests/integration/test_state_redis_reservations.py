"""Token reservations on Redis (`lua.RESERVE`, `lua.RELEASE`) against a real redis-server
started here: a burst across two replicas is admitted only as far as its reservations fit
the global budget, settling refunds or charges the difference, the Lua scripts compute
the ledger's own integer microseconds, with Redis away a replica reserves against its
share (and settles at the share it reserved at, whatever the replicas since), and a
request refused at its reservation keeps its request of `requests_per_minute`."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from gateway.state import Admission, RateLimited, TenantLimits, lua
from gateway.state.ledger import MAX_DEBT_US, settled_tat, tokens_cost_us
from gateway.state.redis_state import RedisKeys
from tests.helpers.redis_server import RedisServer, replica, replicas
from tests.helpers.waiting import until_async

pytestmark = pytest.mark.redis

TPM = 1000
RESERVED = 400  # 24 s of the minute: two fit, a third waits 12 s
PER_US = TPM / 60e6  # tokens the budget replenishes per microsecond


async def _tat(client: aioredis.Redis, key: str) -> int:
    value = await client.get(key)
    assert isinstance(value, bytes), value
    return int(value)


async def _reserve(admission: Admission, tokens: int) -> Admission | RateLimited:
    try:
        await admission.reserve(tokens)
    except RateLimited as refused:
        await admission.release(0)
        return refused
    return admission


def test_a_burst_across_replicas_reserves_no_more_than_the_budget(
    redis_server: RedisServer,
) -> None:
    limits = TenantLimits(tokens_per_minute=TPM)

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            started = time.monotonic()
            admissions = [await (a if i % 2 else b).acquire("acme", limits) for i in range(20)]
            results = await asyncio.gather(*(_reserve(x, RESERVED) for x in admissions))
            elapsed = time.monotonic() - started
            held = [r for r in results if isinstance(r, Admission)]
            refused = [r for r in results if isinstance(r, RateLimited)]
            # Two fit at once; the budget replenishes 1000 tokens a minute meanwhile.
            assert 2 <= len(held) <= 2 + elapsed * 1e6 * PER_US / RESERVED, (held, elapsed)
            assert all(r.limit == "tokens_per_minute" for r in refused)
            assert all(12.0 - elapsed - 1e-3 <= r.retry_after_s <= 12.0 for r in refused)
            assert all(x.shared and x.reserved_shared == RESERVED for x in held)
            assert a.status().fallbacks == b.status().fallbacks == 0

            # A refund: the other replica fits another reservation at once.
            await held[0].release(0)
            again = await b.acquire("acme", limits)
            await again.reserve(RESERVED)
            # An extra charge: 1000 used for 400 reserved moves the budget on 36 s.
            await held[1].release(1000)
            with pytest.raises(RateLimited) as caught:
                await a.acquire("acme", limits)
            assert caught.value.limit == "tokens_per_minute"
            # 24 s reserved + 60 s charged, less the minute: about 24 s to wait
            assert 24.0 - (time.monotonic() - started) - 1e-3 <= caught.value.retry_after_s
            assert caught.value.retry_after_s <= 24.0 + 1e-3
            await again.release(0)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("tpm", "reserved", "used"),
    [(1000, 400, 150), (1000, 400, 900), (7, 3, 5), (7, 5, 3), (600, 0, 11), (333, 17, 0)],
)
def test_the_scripts_compute_the_ledger_s_microseconds(
    redis_server: RedisServer, tpm: int, reserved: int, used: int
) -> None:
    """With the budget's time well ahead of now, neither script's clamp applies: the
    result is the ledger's arithmetic alone, exactly."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        key = RedisKeys("parity").tokens("acme")
        try:
            seconds, micros = await client.time()
            before = seconds * 1_000_000 + micros
            start = before + 30_000_000  # 30 s of debt
            await client.set(key, str(start))
            reply = await client.register_script(lua.RESERVE)(
                keys=[key], args=[tpm, reserved, MAX_DEBT_US]
            )
            if reserved > 0 and tokens_cost_us(reserved, tpm) <= 30_000_000:
                assert [int(x) for x in reply] == [1]
                tat = start + tokens_cost_us(reserved, tpm)
            else:
                tat = start
            if reserved > 0:
                assert await _tat(client, key) == tat
            await client.register_script(lua.RELEASE)(
                keys=[RedisKeys("parity").slots("acme"), RedisKeys("parity").held("acme"), key],
                args=["r", "", tpm, reserved, used, MAX_DEBT_US],
            )
            delta = tokens_cost_us(used, tpm) - tokens_cost_us(reserved, tpm)
            # `before`: Redis's time only moved on since, and no clamp binds
            assert await _tat(client, key) == settled_tat(tat, before, delta)
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_with_redis_away_a_replica_reserves_against_its_share(
    redis_server: RedisServer,
) -> None:
    limits = TenantLimits(tokens_per_minute=TPM)

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, _b):
            await until_async(lambda: a.status().replicas == 2, "a sees b", timeout=15.0)
            redis_server.stop()
            first = await a.acquire("acme", limits)
            await first.reserve(TPM)  # cut to the share: 500 of the 1000
            assert (first.reserved, first.reserved_shared) == (500, 0)
            assert not a.healthy
            second = await a.acquire("acme", limits)
            with pytest.raises(RateLimited) as caught:
                await second.reserve(1)
            assert caught.value.limit == "tokens_per_minute"
            await first.release(0)  # refunded locally
            await second.reserve(500)
            assert a.tenant_use("acme", limits).reserved == 500

    asyncio.run(scenario())


def test_a_reservation_settles_at_the_share_it_was_reserved_at(
    redis_server: RedisServer,
) -> None:
    """The local ledger mirrors a reservation at this replica's share of the budget (500
    of 1000 with two replicas: 400 tokens are 48 s). It settled at the share taken again
    at release: once the other replica left, the refund was 24 s, and 400 tokens stayed
    charged on the ledger that decides while Redis is away."""
    limits = TenantLimits(tokens_per_minute=TPM)

    async def scenario() -> None:
        async with replicas(redis_server, "a") as (a,):
            b = replica(redis_server, "b")
            await b.start()
            try:
                await until_async(lambda: a.status().replicas == 2, "a sees b", timeout=15.0)
                admission = await a.acquire("acme", limits)
                await admission.reserve(RESERVED)
                assert admission.reserved_shared == RESERVED
            finally:
                await b.close()
            await until_async(lambda: a.status().replicas == 1, "b gone", timeout=15.0)
            await admission.release(0)  # nothing used: all of it back, here and on Redis
            use = a.tenant_use("acme", limits)
            assert (use.reserved, use.tokens) == (0, 0)
            # and while Redis is away, the whole budget fits at once
            redis_server.stop()
            alone = await a.acquire("acme", limits)
            await alone.reserve(TPM)
            assert (alone.reserved, alone.shared) == (TPM, False)

    asyncio.run(scenario())


def test_a_request_refused_at_its_reservation_keeps_its_request(
    redis_server: RedisServer,
) -> None:
    """A request admitted (and charged a request) whose tokens then do not fit keeps its
    request, on Redis and on the ledger that decides while Redis is away: its body was
    read and parsed (docs/state.md). It was given back (`lua.REFUND`), and a tenant could
    have bodies that never fit read as fast as it sent them, whatever its limit."""
    limits = TenantLimits(requests_per_minute=3, tokens_per_minute=TPM)

    async def scenario() -> None:
        async with replicas(redis_server, "a", "b") as (a, b):
            first = await a.acquire("acme", limits)
            await first.reserve(900)
            for _ in range(2):  # 2 and 3 of 3, on the other replica
                refused = await b.acquire("acme", limits)
                assert refused.shared
                with pytest.raises(RateLimited) as caught:
                    await refused.reserve(900)
                assert caught.value.limit == "tokens_per_minute"
                await refused.release(0)
            with pytest.raises(RateLimited) as caught:
                await a.acquire("acme", limits)
            assert caught.value.limit == "requests_per_minute"
            # the ledgers that decide while Redis is away kept them too
            assert b.tenant_use("acme", limits).requests == 2
            await first.release(0)

    asyncio.run(scenario())
