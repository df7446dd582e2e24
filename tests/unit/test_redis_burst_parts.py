"""The parts that keep one tenant's burst from widening its limits on Redis, on their own
(no socket): a call's timeout counted on the loop's time to spare
(gateway/state/redis_turns.py), the turns one tenant may hold, and the local charges
kept for Redis, aging as its budgets do (gateway/state/redis_replay.py). On a real
redis-server: tests/integration/test_state_redis_burst.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest
from redis.asyncio import Redis

from gateway.state.redis_replay import UnsharedCharges
from gateway.state.redis_turns import NoTurn, Turns, answered_within
from tests.helpers.clock import FakeClock


def test_an_answer_that_came_while_the_loop_was_busy_is_read() -> None:
    """The answer arrives before the deadline, but the loop is busy past it (blocked
    here): `asyncio.timeout` gives the call up, `answered_within` reads the answer."""

    async def call(bound: Callable[[float], AbstractAsyncContextManager[object]]) -> str:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        loop.call_later(0.01, answer.set_result, "answer")
        loop.call_soon(time.sleep, 0.2)  # the loop busy past the 50 ms deadline
        async with bound(0.05):
            return await answer

    assert asyncio.run(call(answered_within)) == "answer"
    with pytest.raises(TimeoutError):  # what it was before
        asyncio.run(call(asyncio.timeout))


def test_a_call_never_answered_still_times_out() -> None:
    async def call() -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        async with answered_within(0.02):
            await never

    with pytest.raises(TimeoutError):
        asyncio.run(call())


def test_one_tenant_holds_at_most_half_the_turns() -> None:
    async def scenario() -> None:
        turns = Turns(4)
        held = asyncio.Event()
        done = asyncio.Event()

        async def hold(tenant: str) -> None:
            async with turns.turn(tenant, None):
                held.set()
                await done.wait()

        holders = [asyncio.ensure_future(hold("acme")) for _ in range(2)]
        await held.wait()
        with pytest.raises(NoTurn):  # acme's third call finds none within the wait
            async with turns.turn("acme", 0.01):
                pass
        async with turns.turn("beta", 0.0):  # another tenant's finds one at once
            pass
        done.set()
        await asyncio.gather(*holders)
        async with turns.turn("acme", 0.0):  # given back
            pass

    asyncio.run(scenario())


def test_local_charges_age_and_leave_once_redis_took_them() -> None:
    clock = FakeClock()
    charges = UnsharedCharges(Redis(), clock)  # no connection is opened
    charges.add("rpm", 10_000_000)
    charges.add("rpm", 10_000_000)
    assert charges.backlogs() == {"rpm": 20_000_000}
    clock.now += 5.0  # what an outage's elapsed time paid back
    sent = charges.backlogs()
    assert sent == {"rpm": 15_000_000}
    charges.add("tpm", 3_000_000)  # decided while the charge was on its way
    charges.given(sent)
    assert charges.backlogs() == {"tpm": 3_000_000}
    clock.now += 3.0
    assert charges.backlogs() == {}  # aged out: nothing left to send
