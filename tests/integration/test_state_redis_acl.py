"""Replicas on a Redis shared with other programs, under the ACL docs/state.md gives
owngate's user ("Who else may use the Redis"): every path of the shared state works with
no error (admissions under every limit, reservations, releases, in-flight counts,
revocations, a Redis that lost its data restored, a clean exit), every key owngate writes
expires but the three documented never to, and another program's user as the docs
describe it can neither write owngate's keys nor flush them."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError

from gateway.state import RateLimited, TenantLimits
from gateway.state.redis_keys import text
from gateway.state.redis_state import RedisKeys, RedisState
from tests.helpers.paths import REPO_ROOT
from tests.helpers.redis_server import LEASE_TTL_S, SYNC_S, RedisServer
from tests.helpers.waiting import until_async

pytestmark = pytest.mark.redis

WAIT_S = 15.0
KEYS = RedisKeys("test")
LIMITS = TenantLimits(requests_per_minute=100, tokens_per_minute=1000, concurrent=1)
REVOKED = "sha256:" + "e" * 64
NEVER_EXPIRE = {KEYS.revoked, KEYS.revoked_version, KEYS.epoch}  # docs/state.md


def documented_rule(user: str, password: str) -> list[str]:
    """docs/state.md's rule for `user` (owngate's, or another program's `app`), for the
    key prefix `test`."""
    text = " ".join((REPO_ROOT / "docs" / "state.md").read_text().split())
    (rule,) = re.findall(rf"ACL SETUSER {user} [^`]*", text)
    words = rule.replace("{owngate}", "{test}").split()
    return [f">{password}" if word == ">PASSWORD" else word for word in words]


async def set_user(raw: aioredis.Redis, rule: list[str]) -> None:
    await raw.execute_command(*rule)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated


def user_url(server: RedisServer, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def test_replicas_work_under_the_documented_acl(redis_server: RedisServer) -> None:
    password = os.urandom(8).hex()

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)  # the operator, `default`
        try:
            await set_user(raw, documented_rule("owngate", password))
            await raw.acl_log_reset()
            url = user_url(redis_server, "owngate", password)
            a, b = (
                RedisState(
                    url,
                    replica_id=name,
                    key_prefix="test",
                    timeout_s=5.0,
                    sync_interval_s=SYNC_S,
                    lease_ttl_s=LEASE_TTL_S,
                )
                for name in ("a", "b")
            )
            try:
                await a.start()
                await b.start()
                await exercise(a, b, raw)
                for state in (a, b):
                    assert state.healthy and state.status().errors == 0, state.status()
                await expiries(raw)
            finally:
                await a.close()
                await b.close()
            assert a.status().errors == b.status().errors == 0, (a.status(), b.status())
            # redis-py's CLIENT SETINFO (Redis 7.2+), left out of the rule, is all it refused
            refused = [entry for entry in await raw.acl_log() if entry["username"] == "owngate"]
            assert {entry["object"] for entry in refused} <= {"client|setinfo"}, refused
        finally:
            await raw.aclose()

    asyncio.run(scenario())


async def exercise(a: RedisState, b: RedisState, raw: aioredis.Redis) -> None:
    """Every script: ACQUIRE (with another replica's slot counted), RESERVE, RELEASE, the
    HEARTBEAT's counts, REVOKE and READ, RESTORE after Redis lost its data."""
    held = await a.acquire("acme", LIMITS)
    assert held.shared
    await held.reserve(100)
    with pytest.raises(RateLimited):  # a's slot counted on b
        await b.acquire("acme", LIMITS)
    await held.release(0)  # the whole reservation back: the budget full again
    again = await b.acquire("acme", LIMITS)
    assert again.shared
    await again.reserve(50)
    a.backend_started("gpu-1")
    await until_async(lambda: b.inflight("gpu-1") == 1, "a's in-flight seen by b", timeout=WAIT_S)
    assert await a.revoke_key(REVOKED)
    await until_async(lambda: b.is_revoked(REVOKED), "revocation seen by b", timeout=WAIT_S)
    await raw.flushall()  # as a Redis restarted empty: put back by both
    await until_async(
        lambda: a.status().restores >= 1 and b.status().restores >= 1,
        "budgets restored",
        timeout=WAIT_S,
        detail=lambda: (a.status(), b.status()),
    )

    async def rebuilt() -> bool:
        owners = [text(slot).split("|")[0] for slot in await raw.hkeys(KEYS.slots("acme"))]
        return bool(await raw.sismember(KEYS.revoked, REVOKED)) and owners == ["b"]

    await until_async(rebuilt, "revocations and slots written back", timeout=WAIT_S)
    await again.release(60)
    a.backend_finished("gpu-1")


async def expiries(raw: aioredis.Redis) -> None:
    """Every key owngate wrote has an expiry, but the three documented never to."""
    keys = {text(key) for key in await raw.keys("{test}:*")}
    assert keys >= NEVER_EXPIRE and KEYS.leases in keys, keys
    for key in keys:
        ttl = await raw.pttl(key)
        assert (ttl == -1) if key in NEVER_EXPIRE else (ttl > 0), (key, ttl)


def test_another_programs_user_cannot_touch_owngates_keys(redis_server: RedisServer) -> None:
    """A user as docs/state.md asks for another program: its own key pattern, neither
    `@dangerous` nor `@scripting`. Its writes to the prefix, its scripts and its FLUSHALL
    are refused."""
    password = os.urandom(8).hex()

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        other = aioredis.Redis.from_url(user_url(redis_server, "app", password))
        try:
            rule = documented_rule("app", password)
            assert "~app:*" in rule and "-@dangerous" in rule, rule
            await set_user(raw, rule)
            await raw.set(KEYS.requests("acme"), "1")
            await other.set("app:mine", "1")  # its own keys: allowed
            for attempt in (
                other.delete(KEYS.requests("acme")),
                other.srem(KEYS.revoked, REVOKED),
                other.hset(KEYS.leases, "ghost", "1"),
                other.eval("return 1", 0),
                other.flushall(),
            ):
                with pytest.raises(NoPermissionError):
                    await attempt
            assert await raw.get(KEYS.requests("acme")) == b"1"
        finally:
            await other.aclose()
            await raw.aclose()

    asyncio.run(scenario())
