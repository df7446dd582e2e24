"""Turns at the request connections to Redis, for `RedisLimits` (redis_limits.py).

At most `max_connections` request-path calls are in flight at once, first come first
served (an asyncio.Semaphore is fair; redis-py's blocking pool lets late callers barge),
and at most half of them (`per_tenant`) are one tenant's: a tenant's burst queues
behind its own calls, never in front of every other tenant's. Waiting for a turn is not
Redis failing (the call was never sent): it is bounded on its own (`wait_s`), and a
wait past it is `NoTurn`, which the caller answers without degrading the shared state.
Before, the wait counted in the call's `timeout_s`: one tenant's burst of concurrent
requests timed out its own calls while they queued, turned the replica degraded for
every tenant, and what it admitted meanwhile was charged to this replica's ledger only
(docs/state.md#a-burst-waits-its-turn).

A call sent is given `timeout_s` to be answered (`answered_within`) on the event loop's
time to spare: while the loop was too busy to look (a burst's own requests parsed), the
bound waits too (up to a second more), and a reply already in the socket is read
before the call is given up, rather than counted as Redis failing. redis-py bounds each
read on its own, in wall time (`socket_timeout`): the request connections' is
`2 * SPARED_S` past the sync's (redis_state.py), so it never cuts a call first. Before,
it was the sync's (1 s by default, `timeout_s` when longer): a loop busy for longer than
that failed the call with its reply in the socket (`timeout_ms: 1000`, a loop busy 1.5 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.state.types import RateLimited

__all__ = ["TURN_WAIT_S", "NoTurn", "TooManyWaiting", "Turns", "answered_within"]

# How long an admission or a reservation waits for a turn before it is refused (429).
TURN_WAIT_S = 1.0
# A call's timeout is watched in this many looks; what the loop took them late adds
# to it, up to this much more.
TICKS = 5
SPARED_S = 1.0


class NoTurn(Exception):
    """No turn came within the wait's bound: nothing was sent to Redis."""


class TooManyWaiting(RateLimited):
    """A tenant's request found no turn at Redis in time (its own burst, mostly): a 429
    with `retry-after: 1`, never a decision made elsewhere."""

    def __init__(self, tenant: str, per_tenant: int) -> None:
        super().__init__(tenant, "concurrent", per_tenant, 1.0)

    @property
    def message(self) -> str:
        return (
            f"Too many requests of tenant {self.tenant} are waiting to be checked against "
            f"its limits at once: Limit {self.value} checked at a time. "
            "Please try again in 1s."
        )


class Turns:
    """The request connections' turns: `turn(tenant, wait_s)` holds one for a call."""

    def __init__(self, max_connections: int) -> None:
        self._all = asyncio.Semaphore(max_connections)
        self.per_tenant = max(1, max_connections // 2)
        self._tenants: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}  # calls holding or awaiting the tenant's turns

    @asynccontextmanager
    async def turn(self, tenant: str, wait_s: float | None) -> AsyncIterator[None]:
        """Hold one of the tenant's turns and one of all turns for the block; raises
        `NoTurn` when both were not had within `wait_s` (None: wait as long as it takes,
        for releases: each call ahead is bounded by the request timeout)."""
        own = self._tenants.get(tenant)
        if own is None:
            own = self._tenants[tenant] = asyncio.Semaphore(self.per_tenant)
        self._users[tenant] = self._users.get(tenant, 0) + 1
        deadline = None if wait_s is None else asyncio.get_running_loop().time() + wait_s
        try:
            await _take(own, deadline)
            try:
                await _take(self._all, deadline)
                try:
                    yield
                finally:
                    self._all.release()
            finally:
                own.release()
        finally:
            self._users[tenant] -= 1
            if self._users[tenant] == 0:  # tenants come from the config; still, no leftovers
                del self._users[tenant]
                del self._tenants[tenant]


async def _take(semaphore: asyncio.Semaphore, deadline: float | None) -> None:
    try:
        async with asyncio.timeout_at(deadline):
            await semaphore.acquire()
    except TimeoutError:
        raise NoTurn from None


@asynccontextmanager
async def answered_within(timeout_s: float) -> AsyncIterator[None]:
    """`asyncio.timeout(timeout_s)` counted on the loop's time to spare: a look every
    `timeout_s / TICKS` that the loop took late (it was busy: a burst's own requests
    parsed, tasks started) adds the delay to the bound, up to `SPARED_S` more; and the
    block is cancelled only after the loop's next look at its sockets, so a reply
    already there is read first. Raises `TimeoutError` as `asyncio.timeout` does."""
    loop = asyncio.get_running_loop()
    watch = _Watch(loop, timeout_s)
    async with asyncio.timeout(None) as bound:
        watch.start(bound)
        try:
            yield
        finally:
            watch.handle.cancel()


class _Watch:
    """`answered_within`'s looks: its bound moves on by what the loop took them late."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self._loop = loop
        self._tick = timeout_s / TICKS
        self._end = loop.time() + timeout_s
        self._latest = self._end + SPARED_S
        self.handle: asyncio.TimerHandle | asyncio.Handle

    def start(self, bound: asyncio.Timeout) -> None:
        self._next(bound, self._loop.time())

    def _next(self, bound: asyncio.Timeout, now: float) -> None:
        due = min(now + self._tick, self._end)
        self.handle = self._loop.call_at(due, self._look, bound, due)

    def _look(self, bound: asyncio.Timeout, due: float) -> None:
        now = self._loop.time()
        self._end = min(self._end + max(0.0, now - due), self._latest)  # late: busy
        if now < self._end:
            self._next(bound, now)
        else:  # through `call_soon`: the loop polls its sockets before it runs that
            bound.reschedule(now)
