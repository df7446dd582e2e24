"""A Redis that restarts empty (no persistence, a FLUSHALL, an eviction) does not hand a
tenant a whole new minute's budget.

A real gateway shares its limits on a redis-server started here; its tenant spends its
requests-per-minute budget, Redis restarts on the same port with nothing in it, and once
the gateway is back on it (its lease is in Redis again), the tenant is still refused
until its budget refills: the gateway put back, before renewing its lease, what its own
ledger holds of each budget (`lua.RESTORE`). Before, the first request after the restart
found no keys and was admitted, and so were a whole budget's more (10 requests within a
minute on `requests_per_minute: 5`). With two replicas each puts back its own part, and
the parts add up (Redis's `epoch` key says the data was lost, not just a lease)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from gateway.state import TenantLimits
from gateway.state.redis_keys import RedisKeys
from gateway.tenants import hash_api_key
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, Gateway, Sim, backend, readiness
from tests.helpers.processes import GatewayProcess
from tests.helpers.redis_server import RedisServer, replica, replicas
from tests.helpers.waiting import until, until_async

pytestmark = pytest.mark.redis

RPM = 3
TPM = 60  # a token is 1 s of budget: three small requests hold half a minute of it


def _ask(gateway: Gateway, key: str) -> httpx.Response:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def _tat_and_now(client: redis.Redis, key: str) -> tuple[int | None, int]:
    seconds, micros = client.time()
    raw = client.get(key)
    return (None if raw is None else int(raw)), seconds * 1_000_000 + micros


def _tenants(limits: dict[str, int]) -> list[dict[str, Any]]:
    """acme (TENANT_KEY) and other (OTHER_KEY), each with `limits`."""
    keys = (("acme", TENANT_KEY), ("other", OTHER_KEY))
    return [
        {"id": tenant, "api_key_hashes": [hash_api_key(key)], "models": ["*"], "limits": limits}
        for tenant, key in keys
    ]


def _state(server: RedisServer, replica: str | None = None) -> dict[str, Any]:
    return {
        "backend": "redis",
        "url": server.url,
        "replica_id": replica,
        "timeout_ms": 2000,  # a busy test machine must not fall back by accident
        "sync_interval_s": 0.05,
        "lease_ttl_s": 3,
    }


def _restart_and_wait(server: RedisServer, client: redis.Redis, *gateways: Gateway) -> None:
    """Restart Redis empty on its port; back once every gateway holds a lease there
    again (its budgets were restored before, in the same sync) and is on Redis."""
    epoch = client.get("{owngate}:epoch")
    assert epoch is not None
    server.stop()
    server.start()  # same port, empty (the gateways may restore at once: no check here)
    until(
        lambda: client.hlen("{owngate}:leases") == len(gateways),
        "every gateway's lease back in the restarted Redis",
        timeout=30,
    )
    until(
        lambda: all(gateway.app.state.healthy for gateway in gateways),
        "every gateway on Redis again",
        timeout=30,
    )
    assert client.get("{owngate}:epoch") not in (None, epoch)  # the data was lost


def test_a_redis_restarted_empty_keeps_the_budgets_spent(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    redis_server: RedisServer,
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    tenants = _tenants({"requests_per_minute": RPM, "tokens_per_minute": TPM})
    state = _state(redis_server)
    gateway = start_gateway([backend("gpu", sim.url, "m")], tenants=tenants, state=state)
    client = redis.Redis(port=redis_server.port)
    try:
        assert [_ask(gateway, TENANT_KEY).status_code for _ in range(RPM)] == [200] * RPM
        refused = _ask(gateway, TENANT_KEY)
        assert refused.status_code == 429, refused.text
        tokens_before, _ = _tat_and_now(client, "{owngate}:tpm:acme")
        assert tokens_before is not None

        _restart_and_wait(redis_server, client, gateway)

        again = _ask(gateway, TENANT_KEY)
        assert again.status_code == 429, again.text  # was 200: a fresh budget
        error = again.json()["error"]
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
        # The tokens budget is back as well, as far as it ran ahead before the restart
        # (less the time the restart took: the ledger and Redis agree to a few ms).
        tokens_after, now = _tat_and_now(client, "{owngate}:tpm:acme")
        assert tokens_after is not None and tokens_after > now
        assert tokens_after <= tokens_before + 1_000_000
        # and says so: the readiness detail and /metrics count the restore
        assert readiness(gateway.url)["state"]["restores"] == 1
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
        assert "owngate_state_restores_total 1.0" in metrics.splitlines()
        # Nothing is made up for a tenant that spent nothing.
        assert client.get("{owngate}:rpm:other") is None
        assert _ask(gateway, OTHER_KEY).status_code == 200
    finally:
        client.close()


def _two_replicas(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    redis_server: RedisServer,
    rpm: int,
) -> tuple[Gateway, Gateway]:
    """Two gateways sharing `redis_server`, a tenant limited to `rpm` requests a minute."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    tenants = _tenants({"requests_per_minute": rpm})
    a, b = (
        start_gateway(
            [backend("gpu", sim.url, "m")], tenants=tenants, state=_state(redis_server, r)
        )
        for r in ("replica-a", "replica-b")
    )
    return a, b


def test_two_replicas_each_put_back_their_part_of_a_budget(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    redis_server: RedisServer,
) -> None:
    rpm = 4
    a, b = _two_replicas(start_sim, start_gateway, redis_server, rpm)
    client = redis.Redis(port=redis_server.port)
    try:
        until(lambda: client.hlen("{owngate}:leases") == 2, "both replicas on Redis", timeout=30)
        # half the budget through each replica: all of it, across both
        spent = [_ask(g, TENANT_KEY).status_code for g in (a, a, b, b)]
        assert spent == [200] * rpm
        assert _ask(a, TENANT_KEY).status_code == 429

        _restart_and_wait(redis_server, client, a, b)

        # each replica put back its two requests: the budget is spent still, on both
        # (a max of the two, as after a stall, left two requests' room: was 200)
        for gateway in (a, b):
            again = _ask(gateway, TENANT_KEY)
            assert again.status_code == 429, again.text
            assert again.json()["error"]["type"] == "requests"
    finally:
        client.close()


def test_a_gateway_that_never_reaches_redis_says_why_in_its_log(
    process: Callable[..., GatewayProcess], redis_server: RedisServer
) -> None:
    """A wrong password (or an ACL, or Redis down at start) leaves the gateway on local
    state from its first sync: its log says so, with Redis's reason and never the
    password (before, only a lost connection after a success was logged: a gateway that
    never reached Redis ran on local limits without a line about it)."""
    password = "og-wrong-redis-password-4711"
    admin = redis.Redis(port=redis_server.port)
    admin.config_set("requirepass", "the-right-one")
    admin.close()
    url = f"redis://:{password}@127.0.0.1:{redis_server.port}/0"
    gateway = process(state={"backend": "redis", "url": url}).start()
    until(
        lambda: "shared state degraded" in gateway.output(),
        "the gateway logging that it runs on local state",
        timeout=30,
        detail=gateway.output,
    )
    line = next(
        json.loads(line)
        for line in (gateway.stdout() + gateway.stderr()).splitlines()
        if "shared state degraded" in line
    )
    assert line["level"] == "warning"
    assert line["reason"].startswith("redis sync failed: AuthenticationError")
    assert readiness(gateway.url)["state"]["healthy"] is False
    gateway.stop()
    assert not any(password.encode() in written for written in gateway.written())


def test_a_budget_spent_through_one_of_two_replicas_is_put_back_whole(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    redis_server: RedisServer,
) -> None:
    """A client on one kept-alive connection reaches one replica only (an L4 balancer
    pins it): that replica admitted the whole budget on Redis. Before, its ledger charged
    each request at its share's interval but capped the debt at one share's bucket, so it
    put back half the budget and the tenant got two more requests after the restart."""
    rpm = 4
    a, b = _two_replicas(start_sim, start_gateway, redis_server, rpm)
    client = redis.Redis(port=redis_server.port)
    try:
        until(lambda: client.hlen("{owngate}:leases") == 2, "both replicas on Redis", timeout=30)
        until(
            lambda: all(readiness(g.url)["state"]["replicas"] == 2 for g in (a, b)),
            "both replicas counting two",
            timeout=30,
        )
        assert [_ask(a, TENANT_KEY).status_code for _ in range(rpm)] == [200] * rpm
        assert _ask(a, TENANT_KEY).status_code == 429

        _restart_and_wait(redis_server, client, a, b)

        for gateway in (a, a, b):
            again = _ask(gateway, TENANT_KEY)
            assert again.status_code == 429, again.text
            assert again.json()["error"]["type"] == "requests"
    finally:
        client.close()


def test_replicas_started_while_redis_was_away_add_their_parts(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    redis_server: RedisServer,
) -> None:
    """Two replicas that never reached Redis (started while it was down, as after a
    whole deployment restarts) admitted locally, half of a budget each; Redis comes up
    empty. Neither had seen an epoch, and before, both put back a max of their parts,
    not the sum: the tenant got half a budget more."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    rpm = 4
    tenants = _tenants({"requests_per_minute": rpm})
    redis_server.stop()
    a, b = (
        start_gateway(
            [backend("gpu", sim.url, "m")], tenants=tenants, state=_state(redis_server, r)
        )
        for r in ("replica-a", "replica-b")
    )
    assert not a.app.state.healthy and not b.app.state.healthy
    spent = [_ask(g, TENANT_KEY).status_code for g in (a, a, b, b)]
    assert spent == [200] * rpm
    redis_server.start()  # empty
    client = redis.Redis(port=redis_server.port)
    try:
        until(lambda: client.hlen("{owngate}:leases") == 2, "both replicas on Redis", timeout=30)
        until(lambda: a.app.state.healthy and b.app.state.healthy, "both on Redis", timeout=30)
        for gateway in (a, b):
            again = _ask(gateway, TENANT_KEY)
            assert again.status_code == 429, again.text
            assert again.json()["error"]["type"] == "requests"
    finally:
        client.close()


def test_a_restore_whose_reply_was_lost_is_not_added_twice(redis_server: RedisServer) -> None:
    """Redis ran a replica's RESTORE but the reply never came (the sync timed out on a
    busy Redis, the connection dropped): the next sync restores again, its lease still
    gone and the epoch it knows still the old one. Before, it added its backlog a second
    time (and a third at every further lost reply): the tenant was charged twice."""
    limits = TenantLimits(requests_per_minute=4)

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        async with replicas(redis_server, "replica-a") as (state,):
            for _ in range(2):  # half the budget: 30 s ahead
                await state.acquire("acme", limits)
            real = state._restore_run._script
            lost: list[bool] = []

            async def reply_lost(*, keys: list[str], args: list[str | int]) -> Any:
                reply = await real(keys=keys, args=args)
                if int(reply[0]) == 2 and not lost:
                    lost.append(True)
                    raise TimeoutError("the reply was lost")
                return reply

            state._restore_run._script = reply_lost  # type: ignore[assignment]
            await raw.flushall()
            await until_async(lambda: bool(lost), "a restore whose reply was lost", timeout=30)
            await until_async(
                lambda: state.healthy and state.status().restores == 1,
                "the replica on Redis again",
                timeout=30,
            )
            seconds, micros = await raw.time()
            tat = int(await raw.get(RedisKeys("test").requests("acme")) or 0)
            ahead_s = (tat - (seconds * 1_000_000 + micros)) / 1e6
            assert 20 < ahead_s <= 30, ahead_s  # was 60: added twice
        await raw.aclose()

    asyncio.run(scenario())


def test_a_restarted_replica_with_the_same_id_adds_its_local_use(
    redis_server: RedisServer,
) -> None:
    """A replica restarted with the same configured id (a pod's `replica_id`) within
    two minutes of its previous process's restore: what the new process admitted before
    it reached Redis is added, not taken as a max because `restored` names the id (it
    names the process too)."""
    limits = TenantLimits(requests_per_minute=4)

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        async with replicas(redis_server, "gw") as (first,):
            for _ in range(2):  # half the budget, on Redis
                await first.acquire("acme", limits)
            await raw.flushall()  # put back by `first`: 30 s ahead
            await until_async(lambda: first.status().restores == 1, "the restore", timeout=30)
        second = replica(redis_server, "gw")
        try:
            for _ in range(2):  # the other half, decided locally before its first sync
                await second.acquire("acme", limits)
            await second.start()
            assert second.healthy, second.degraded_reason
            seconds, micros = await raw.time()
            tat = int(await raw.get(RedisKeys("test").requests("acme")) or 0)
            ahead_s = (tat - (seconds * 1_000_000 + micros)) / 1e6
            assert ahead_s > 45, ahead_s  # was 30: a max of the two halves
        finally:
            await second.close()
            await raw.aclose()

    asyncio.run(scenario())


def test_tokens_spent_before_a_replica_joined_are_put_back_whole(
    redis_server: RedisServer,
) -> None:
    """A replica alone spent half a tokens budget; a second replica joins, so the first
    one's next admission is given half the limit as its share. Before, the restore
    scaled the whole ledger by that last share: half of what was spent went back."""
    limits = TenantLimits(tokens_per_minute=600)  # a token is 0.1 s of budget

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        async with replicas(redis_server, "replica-a") as (a,):
            admission = await a.acquire("acme", limits)
            await admission.reserve(300)  # 30 s
            await admission.release(300)
            async with replicas(redis_server, "replica-b"):
                await until_async(lambda: a.status().replicas == 2, "a sees b", timeout=30)
                await (await a.acquire("acme", limits)).release(0)  # at a share of two
                await raw.flushall()
                await until_async(lambda: a.status().restores == 1, "the restore", timeout=30)
                seconds, micros = await raw.time()
                tat = int(await raw.get(RedisKeys("test").tokens("acme")) or 0)
                ahead_s = (tat - (seconds * 1_000_000 + micros)) / 1e6
                assert 20 < ahead_s <= 30, ahead_s  # was 15: scaled by the last share
        await raw.aclose()

    asyncio.run(scenario())
