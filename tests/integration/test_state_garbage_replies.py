"""RedisState against a server that speaks RESP but answers the admission scripts with
nonsense (a proxy, another program on the port, a bug): a reply of the wrong shape is
a Redis failure like any other. Before, `acquire` raised KeyError/TypeError/IndexError
out of the request path (a 500 for every request of a limited tenant) while the status
stayed healthy, and the concurrency slot taken for the call was never given back, so a
tenant with `concurrent_requests` was locked out once Redis was decided locally.
Also: the workers of `serve --workers N` that never reached Redis (a closed port) split
each limit over the N of them."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from gateway.state import RateLimited, TenantLimits, create_state, lua
from gateway.state.redis_replay import CHARGE
from gateway.state.redis_revocations import READ
from gateway.state.redis_state import RedisState


def _sha(script: str) -> bytes:
    return hashlib.sha1(script.encode()).hexdigest().encode()


def _array(*items: int | bytes) -> bytes:
    out = b"*%d\r\n" % len(items)
    for item in items:
        out += b":%d\r\n" % item if isinstance(item, int) else b"$%d\r\n%s\r\n" % (len(item), item)
    return out


# A healthy-looking HEARTBEAT (resync done, one live replica, no revocations), the
# revoked set's read (empty), RESTORE (lease live) and CHARGE (the one rate key a local
# decision of these tests charged), so the replica believes Redis works; the
# request-path scripts get the garbage under test.
_SYNC = {
    _sha(lua.HEARTBEAT): _array(1, 1, 0, 0),
    _sha(READ): _array(0),
    _sha(lua.RESTORE): _array(0, b"e"),
    _sha(CHARGE): _array(1),
}
GARBAGE = {
    "simple-string": b"+OK\r\n",
    "integer": b":7\r\n",
    "empty-array": b"*0\r\n",
    "strings": _array(b"zero", b"x", b"y"),
    "unknown-limit": _array(0, 9, 1000),
    "unknown-code": _array(5),
    "negative-wait": _array(0, 2, -5),
}


async def _read_command(reader: asyncio.StreamReader) -> list[bytes]:
    header = await reader.readline()
    if not header.startswith(b"*"):
        raise ConnectionError("not an array")
    parts = []
    for _ in range(int(header[1:])):
        size = int((await reader.readline())[1:])
        parts.append((await reader.readexactly(size + 2))[:-2])
    return parts


@asynccontextmanager
async def fake_redis(
    garbage: bytes, *, sync: bool = True, read: bytes | None = None
) -> AsyncIterator[str]:
    """A server answering each EVALSHA with `garbage`, except the sync's scripts when
    `sync` (then they get a healthy-looking answer; the revoked set's read gets `read`
    when given)."""
    answers = dict(_SYNC) if sync else {}
    if read is not None:
        answers[_sha(READ)] = read

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                command = await _read_command(reader)
                if command[0].upper() == b"EVALSHA":
                    writer.write(answers.get(command[1].lower(), garbage))
                else:  # CLIENT SETNAME and the like
                    writer.write(b"+OK\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.close()


def _state(url: str) -> RedisState:
    # a slow sync: the garbage answer's effect is read before any sync heals it
    return RedisState(
        url, replica_id="r", key_prefix="test", timeout_s=2.0, sync_interval_s=10, lease_ttl_s=30
    )


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_admission_reply_is_a_failure_decided_locally(kind: str) -> None:
    """Each admission answered with garbage is decided on the local ledger (never an
    exception but `RateLimited`), the state says why, and no slot leaks: a tenant
    with `concurrent_requests: 1` is admitted again after each release."""
    limits = TenantLimits(requests_per_minute=100, tokens_per_minute=None, concurrent=1)

    async def scenario() -> None:
        async with fake_redis(GARBAGE[kind]) as url:
            state = _state(url)
            await state.start()
            try:
                assert state.healthy, state.degraded_reason
                for _ in range(3):
                    admission = await state.acquire("acme", limits)
                    assert not state.healthy
                    assert "malformed" in (state.degraded_reason or ""), state.status()
                    with pytest.raises(RateLimited):  # the one slot is held
                        await state.acquire("acme", limits)
                    await admission.release(0)
                    await state._sync()  # the fake's HEARTBEAT heals it
                    assert state.healthy, state.degraded_reason
                assert state.status().errors >= 3
            finally:
                await state.close(deregister=False)

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_reservation_reply_is_a_failure_decided_locally(kind: str) -> None:
    """A token reservation answered with garbage is checked on the local ledger: a
    reservation past the budget is refused, never admitted nor raised as another error."""
    limits = TenantLimits(requests_per_minute=None, tokens_per_minute=1000, concurrent=None)

    async def scenario() -> None:
        async with fake_redis(GARBAGE[kind]) as url:
            state = _state(url)
            await state.start()
            try:
                admission = await state.acquire("acme", limits)  # decided locally
                await state._sync()
                assert state.healthy, state.degraded_reason
                await admission.reserve(600)
                assert not state.healthy
                assert "malformed" in (state.degraded_reason or "")
                second = await state.acquire("acme", limits)
                with pytest.raises(RateLimited):  # 600 + 600 > 1000 on the ledger
                    await second.reserve(600)
                await second.release(0)
                await admission.release(600)
            finally:
                await state.close(deregister=False)

    asyncio.run(scenario())


def test_workers_that_never_reached_redis_split_each_limit_over_the_workers() -> None:
    """`serve --workers 2` with Redis down at start: each worker has seen no replica in
    Redis, and before enforced the whole limit on its own (2 x `requests_per_minute`
    across the workers: 4 + 4 of 4). Each now splits it over the workers it knows of."""
    limits = TenantLimits(requests_per_minute=4, tokens_per_minute=None, concurrent=None)

    async def scenario() -> None:
        async with fake_redis(b"") as url:  # a port; nothing in Redis is ever reached
            pass
        workers = [
            create_state("redis", url, replica_id=f"w{i}", timeout_s=0.5, workers=2) for i in (1, 2)
        ]
        admitted = 0
        for state in workers:
            await state.start()
            for _ in range(4):
                try:
                    await (await state.acquire("acme", limits)).release(0)
                    admitted += 1
                except RateLimited:
                    pass
        statuses = [state.status() for state in workers]
        for state in workers:
            await state.close()
        assert admitted == 4, statuses
        assert all(not s.healthy and s.replicas == 2 for s in statuses), statuses

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_heartbeat_reply_is_never_read_as_healthy(kind: str) -> None:
    """A sync answered with garbage leaves the state degraded, with a reason that names
    the shape only: before, `+OK` was read as a renewed lease and 75 live replicas
    (b"OK"[1]), and the state said healthy."""

    async def scenario() -> None:
        async with fake_redis(GARBAGE[kind], sync=False) as url:
            state = _state(url)
            await state.start()
            try:
                assert not state.healthy, state.status()
                reason = state.degraded_reason or ""
                assert "malformed" in reason and "zero" not in reason, reason
                assert state.status().replicas == 1
            finally:
                await state.close(deregister=False)

    asyncio.run(scenario())


DIGEST = b"sha256:" + b"ab" * 32
BAD_READS = {
    "foreign-member": _array(2, DIGEST, b"A" * 4096),
    "more-members-than-size": _array(1, DIGEST, DIGEST),
    "no-size": _array(DIGEST),
    "simple-string": b"+OK\r\n",
}


@pytest.mark.parametrize("kind", sorted(BAD_READS))
def test_garbage_revocations_reply_is_never_cached(kind: str) -> None:
    """A read of the revoked set answered with anything but its size and digests leaves
    the state degraded and caches nothing of it: READ (redis_revocations.py) sends only
    digests, so a member of another shape is no answer of ours."""

    async def scenario() -> None:
        async with fake_redis(b"*0\r\n", read=BAD_READS[kind]) as url:
            state = _state(url)
            await state.start()
            try:
                assert not state.healthy, state.status()
                reason = state.degraded_reason or ""
                assert "malformed revocations reply" in reason and "AAAA" not in reason
                assert state.revocations == 0
            finally:
                await state.close(deregister=False)

    asyncio.run(scenario())
