"""A real redis-server that fails in the ways a shared or managed Redis does: full
(`-OOM`), turned replica (`-READONLY`), its script cache flushed (`-NOSCRIPT`), held by
another program's script (`-BUSY`), another program's value of the wrong type under the
prefix (`-WRONGTYPE`), stopped (SIGSTOP: the port still accepts, nothing answers).

Each must leave the replica serving on its local ledger without failing open: a tenant
that spent its budget on Redis stays refused, a key revoked meanwhile is refused here at
once and stored in Redis once it answers again; the fault shows in `degraded_reason`,
named (never Redis's own text), and heals without a restart."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import redis.asyncio as aioredis

from gateway.state import RateLimited, TenantLimits
from gateway.state.redis_state import RedisKeys, RedisState
from tests.helpers.net import free_port
from tests.helpers.redis_server import RedisServer, replicas
from tests.helpers.waiting import until_async

pytestmark = pytest.mark.redis

WAIT_S = 15.0
KEYS = RedisKeys("test")
SPENT = TenantLimits(requests_per_minute=2)  # spent on Redis before the fault
ROOMY = TenantLimits(requests_per_minute=1000)
REVOKED = "sha256:" + "d" * 64
# Another program's script that holds Redis until SCRIPT KILL (it writes nothing).
SPIN = "while true do end"


class Fault:
    """How to cause one fault on `server`, what `degraded_reason` then says, and how to
    end it."""

    def __init__(self, server: RedisServer, kind: str) -> None:
        self.server = server
        self.kind = kind
        self._spinner: asyncio.Task[object] | None = None
        self._other: aioredis.Redis | None = None

    @property
    def says(self) -> str | None:
        return {
            "oom": "OutOfMemoryError",
            "readonly": "ReadOnlyError",
            "noscript": None,  # redis-py loads the script again: no fault at all
            "busy": "ResponseError BUSY",
            "wrongtype": "ResponseError WRONGTYPE",
            "stopped": "no answer within",
        }[self.kind]

    async def begin(self, raw: aioredis.Redis) -> None:
        if self.kind == "oom":
            await raw.config_set("maxmemory", "1")
        elif self.kind == "readonly":  # a failover left the URL on a replica
            await raw.replicaof("127.0.0.1", free_port())
        elif self.kind == "noscript":
            await raw.script_flush()
        elif self.kind == "busy":
            await raw.config_set("lua-time-limit", "10")
            other = self._other = aioredis.Redis.from_url(self.server.url)

            async def spin() -> object:
                return await other.eval(SPIN, 0)

            self._spinner = asyncio.create_task(spin())
        elif self.kind == "wrongtype":  # another program's string where a set belongs
            await raw.delete(KEYS.revoked)
            await raw.set(KEYS.revoked, "another program's")
        else:
            assert self.server.process is not None
            os.kill(self.server.process.pid, signal.SIGSTOP)

    async def end(self, raw: aioredis.Redis) -> None:
        if self.kind == "oom":
            await raw.config_set("maxmemory", "0")
        elif self.kind == "readonly":
            await raw.replicaof("NO", "ONE")
        elif self.kind == "busy":
            await self._stop_spinning()
            await raw.config_set("lua-time-limit", "5000")
        elif self.kind == "wrongtype":
            await raw.delete(KEYS.revoked)
        elif self.kind == "stopped":
            self.resume()

    def resume(self) -> None:
        if self.kind == "stopped" and self.server.process is not None:
            os.kill(self.server.process.pid, signal.SIGCONT)

    async def cleanup(self) -> None:
        """Whatever the test did: Redis running and no script of another program left."""
        self.resume()
        await self._stop_spinning()

    async def _stop_spinning(self) -> None:
        spinner, self._spinner = self._spinner, None
        if spinner is not None:
            await until_async(lambda: self._kill(spinner), "the script killed", timeout=WAIT_S)
            # "Script killed by user" (or its caller gave up waiting first)
            assert isinstance(spinner.exception(), aioredis.RedisError)
        if self._other is not None:
            await self._other.aclose()
            self._other = None

    async def _kill(self, spinner: asyncio.Task[object]) -> bool:
        """Kill the script: True once none runs and its caller has heard."""
        killer = aioredis.Redis.from_url(self.server.url)
        try:
            await killer.script_kill()
        except aioredis.ResponseError:  # NOTBUSY: none runs (not yet, or no more)
            return spinner.done()
        finally:
            await killer.aclose()
        return False


@pytest.mark.parametrize("kind", ["oom", "readonly", "noscript", "busy", "wrongtype", "stopped"])
def test_a_failing_redis_is_survived_shown_and_never_fails_open(
    redis_server: RedisServer, kind: str
) -> None:
    fault = Fault(redis_server, kind)

    async def scenario() -> None:
        raw = aioredis.Redis.from_url(redis_server.url)
        try:
            async with replicas(redis_server, "a", timeout_s=1.0) as (a,):
                for _ in range(2):
                    spent = await a.acquire("acme", SPENT)
                    assert spent.shared
                    await spent.release()
                await fault.begin(raw)
                try:
                    await during(a, fault)
                    await fault.end(raw)
                finally:
                    await fault.cleanup()
                await until_async(lambda: a.healthy, "healed", timeout=WAIT_S, detail=a.status)

                async def stored() -> bool:
                    return bool(await raw.sismember(KEYS.revoked, REVOKED))

                await until_async(
                    stored,
                    "the revocation made meanwhile stored in Redis",
                    timeout=WAIT_S,
                    detail=a.status,
                )
                with pytest.raises(RateLimited):  # the budget spent before still counts
                    await a.acquire("acme", SPENT)
                admission = await a.acquire("beta", ROOMY)
                assert admission.shared
                await admission.release()
        finally:
            await raw.aclose()

    asyncio.run(scenario())


async def during(a: RedisState, fault: Fault) -> None:
    says = fault.says
    if says is not None:
        await until_async(
            lambda: not a.healthy and says in (a.degraded_reason or ""),
            f"degraded, saying {says}",
            timeout=WAIT_S,
            detail=a.status,
        )
    # The tenant that spent its budget on Redis stays refused (its ledger mirrors it);
    # another is served, locally while Redis fails.
    with pytest.raises(RateLimited):
        await a.acquire("acme", SPENT)
    admission = await a.acquire("beta", ROOMY)
    assert admission.shared is (says is None)
    await admission.release()
    # A revocation made meanwhile holds here at once.
    assert await a.revoke_key(REVOKED) is (says is None)
    assert a.is_revoked(REVOKED)
    status = a.status()
    if says is None:
        assert a.healthy and status.errors == 0, status
    else:
        assert status.errors > 0 and status.fallbacks > 0, status
        assert status.pending_revocations == 1, status
