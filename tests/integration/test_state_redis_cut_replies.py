"""Redis's replies cut or dripped on the way (a proxy, a lossy network): a real
redis-server behind a TCP proxy that passes the replies on the replica's request
connections, drips them a byte at a time (slower than its timeout), or resets the
connection after a reply's first byte (its sync's connections pass). The admission ran
on Redis, and added its slot there; the replica never learns it. It must answer locally
without hanging or failing open (the concurrency limit holds), say why, and leave Redis
holding exactly the slots it holds: the cut admission's slot removed by the resync, none
held lost. And replies held back while the sync fails: what Redis admitted or reserved
and has not answered yet counts in the decisions made locally meanwhile."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import pytest
import redis.asyncio as aioredis

from gateway.state import RateLimited, TenantLimits
from gateway.state.redis_keys import text
from gateway.state.redis_state import RedisKeys, RedisState
from tests.helpers.redis_server import LEASE_TTL_S, SYNC_S, RedisServer, replicas
from tests.helpers.waiting import until_async

pytestmark = pytest.mark.redis

WAIT_S = 15.0
DRIP_S = 0.2  # per byte: any reply takes longer than the timeouts below
LIMITS = TenantLimits(concurrent=4)  # 2 a replica while Redis fails (a and b)
KEYS = RedisKeys("test")


class CuttingProxy:
    """Forwards to Redis; replies on request connections (not named `...:sync`) pass,
    drip or are cut (`mode`) as they come back."""

    def __init__(self, port: int) -> None:
        self._port = port
        self.mode = "pass"
        self.cut = 0  # replies cut, dripped or held so far
        self.let_go = asyncio.Event()  # ends "hold": held replies go on
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._writers |= {writer, up_writer}
        said = bytearray()  # what the client sent first: its CLIENT SETNAME
        pumps = [
            asyncio.create_task(self._up(reader, up_writer, said)),
            asyncio.create_task(self._down(up_reader, writer, said)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for each in (writer, up_writer):
                self._writers.discard(each)
                each.transport.abort()

    async def _up(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, said: bytearray
    ) -> None:
        with suppress(OSError):
            while data := await reader.read(65536):
                said += data[: max(0, 4096 - len(said))]
                writer.write(data)
                await writer.drain()

    async def _down(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, said: bytearray
    ) -> None:
        with suppress(OSError):
            while data := await reader.read(65536):
                mode = self.mode
                if mode == "hold" and b":sync" in said:
                    mode = "reset"  # the sync fails: the state decides locally
                elif mode == "hold":  # until `let_go`
                    self.cut += 1
                    await self.let_go.wait()
                    mode = "pass"
                elif b":sync" in said:
                    mode = "pass"
                if mode == "pass":
                    writer.write(data)
                    await writer.drain()
                    continue
                if b":sync" not in said:  # the replica's request connection
                    self.cut += 1
                if mode == "reset":  # the first byte, then a reset (RST, not FIN)
                    writer.write(data[:1])
                    await writer.drain()
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                for i in range(len(data)):  # drip
                    writer.write(data[i : i + 1])
                    await writer.drain()
                    await asyncio.sleep(DRIP_S)


@asynccontextmanager
async def behind_proxy(
    server: RedisServer, timeout_s: float = 0.5
) -> AsyncIterator[tuple[RedisState, CuttingProxy]]:
    proxy = CuttingProxy(server.port)
    port = await proxy.start()
    state = RedisState(
        f"redis://127.0.0.1:{port}/0",
        replica_id="a",
        key_prefix="test",
        timeout_s=timeout_s,
        sync_interval_s=SYNC_S,
        lease_ttl_s=LEASE_TTL_S,
    )
    try:
        await state.start()
        assert state.healthy, state.status()
        yield state, proxy
    finally:
        proxy.mode = "pass"
        proxy.let_go.set()
        await state.close()
        await proxy.close()


async def settled(server: RedisServer, slots: set[str | None]) -> None:
    """Wait until Redis holds exactly these slot fields of the tenant."""
    raw = aioredis.Redis.from_url(server.url)
    found: set[str | None] = set()

    async def holds() -> bool:
        found.clear()
        found.update(text(field) for field in await raw.hkeys(KEYS.slots("acme")))
        return found == slots

    try:
        await until_async(holds, f"slots {slots}", timeout=WAIT_S, detail=lambda: found)
    finally:
        await raw.aclose()


@pytest.mark.parametrize(("mode", "says"), [("drip", "no answer within"), ("reset", "Error")])
def test_replies_cut_or_dripped_are_answered_locally_and_healed(
    redis_server: RedisServer, mode: str, says: str
) -> None:
    async def scenario() -> None:
        async with behind_proxy(redis_server) as (a, proxy), replicas(redis_server, "b") as (b,):
            await until_async(lambda: a.status().replicas == 2, "b seen by a", timeout=WAIT_S)
            held = await a.acquire("acme", LIMITS)
            assert held.shared
            proxy.mode = mode
            # The script ran on Redis (its reply reached the proxy: `cut`) and added a slot
            # there; its reply never comes whole: decided here, on a slot of its own.
            second = await asyncio.wait_for(a.acquire("acme", LIMITS), WAIT_S)
            assert not second.shared and proxy.cut == 1
            reason = a.degraded_reason
            assert reason is not None and reason.startswith("redis admission failed: "), reason
            assert says in reason, reason
            with pytest.raises(RateLimited):  # two held here: its share of the limit
                await a.acquire("acme", LIMITS)
            proxy.mode = "pass"
            await until_async(lambda: a.healthy, "healed", timeout=WAIT_S, detail=a.status)
            await settled(redis_server, {held.slot, second.slot})  # the orphan removed
            on_b = [await b.acquire("acme", LIMITS) for _ in range(2)]
            assert all(admission.shared for admission in on_b)
            with pytest.raises(RateLimited):  # a's two counted on b: the limit holds
                await b.acquire("acme", LIMITS)
            for admission in (held, second, *on_b):
                await admission.release()
            await settled(redis_server, set())

    asyncio.run(scenario())


def test_an_admission_redis_has_not_answered_yet_counts_in_a_local_decision(
    redis_server: RedisServer,
) -> None:
    """Redis admitted a request, its answer is on the way, and Redis stops answering (the
    sync fails first): the requests decided locally meanwhile must count it. Before, the
    ledger counted it only once the answer came, so with `requests_per_minute: 1` one
    request was admitted locally and then the one Redis had admitted too: two (a burst of
    200 requests on a busy machine did the same, its calls timing out waiting for a
    connection while the first was answered)."""
    limits = TenantLimits(requests_per_minute=1)

    async def scenario() -> None:
        async with behind_proxy(redis_server, timeout_s=5.0) as (a, proxy):
            proxy.mode = "hold"
            first = asyncio.create_task(a.acquire("acme", limits))
            await until_async(lambda: proxy.cut >= 1, "Redis answered the admission")
            await until_async(lambda: not a.healthy, "degraded", timeout=WAIT_S, detail=a.status)
            with pytest.raises(RateLimited):  # the one in flight counts here
                await a.acquire("acme", limits)
            proxy.let_go.set()
            admitted = await first  # Redis's answer comes: admitted there
            assert admitted.shared
            await admitted.release()

    asyncio.run(scenario())


def test_a_reservation_redis_has_not_answered_yet_counts_in_a_local_decision(
    redis_server: RedisServer,
) -> None:
    """As above for tokens: a reservation Redis made whose answer is on the way counts in
    a reservation decided locally meanwhile. Before, with `tokens_per_minute: 1000`, a
    second reservation of 600 was made locally while Redis held the first: 1200."""
    limits = TenantLimits(tokens_per_minute=1000)

    async def scenario() -> None:
        async with behind_proxy(redis_server, timeout_s=5.0) as (a, proxy):
            first = await a.acquire("acme", limits)
            assert first.shared
            proxy.mode = "hold"
            reserving = asyncio.create_task(first.reserve(600))
            await until_async(lambda: proxy.cut >= 1, "Redis answered the reservation")
            await until_async(lambda: not a.healthy, "degraded", timeout=WAIT_S, detail=a.status)
            second = await a.acquire("acme", limits)  # some budget left: admitted
            assert not second.shared
            with pytest.raises(RateLimited):  # but the 600 in flight count here
                await second.reserve(600)
            proxy.let_go.set()
            await reserving  # Redis's answer comes: reserved there
            assert first.reserved_shared == 600
            await first.release(600)
            await second.release()

    asyncio.run(scenario())


class _Unforeseen(Exception):
    """An error of no class the admission expects (a fault of redis-py's or our own)."""


def test_an_admission_call_failing_unforeseen_leaves_nothing_counted(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admission's Redis call raises an error of no class it expects (not Redis
    failing, not a malformed reply, not a cancellation): the request fails, and nothing of
    it may stay counted here. Before, its in-flight admission stayed pending (and its slot
    taken) for good, so every decision made locally afterwards counted it: with
    `requests_per_minute: 1` the tenant was refused whenever Redis was away, forever."""
    limits = TenantLimits(requests_per_minute=1, concurrent=1)

    async def scenario() -> None:
        async with behind_proxy(redis_server, timeout_s=5.0) as (a, proxy):
            calls = 0

            async def unforeseen(*_args: object, **_kwargs: object) -> object:
                nonlocal calls
                calls += 1
                raise _Unforeseen("no class the admission expects")

            monkeypatch.setattr(a._limits, "_call", unforeseen)
            with pytest.raises(_Unforeseen):
                await a.acquire("acme", limits)
            assert calls == 1
            monkeypatch.undo()  # the class's own again
            proxy.mode = "reset"  # Redis fails: decided here, on nothing charged
            admitted = await asyncio.wait_for(a.acquire("acme", limits), WAIT_S)
            assert not admitted.shared, a.status()
            with pytest.raises(RateLimited):  # the limit holds: the one admitted counts
                await a.acquire("acme", limits)
            await admitted.release()

    asyncio.run(scenario())
