"""`settle` makes the tenant's charge whole whatever cancels its request meanwhile.

A cancellation sent through `exchange.cancel` (the disconnect watch, the drain deadline's
cut) while the charge runs is held back until the charge is made, then raised; one sent
outside a charge cancels at once. The charge's await is an event the test sets."""

from __future__ import annotations

import asyncio

import pytest

from gateway.api.exchange import Exchange, cancel, settle


def test_a_cancel_during_the_charge_waits_for_it_then_is_raised() -> None:
    async def scenario() -> None:
        entered, go = asyncio.Event(), asyncio.Event()
        made: list[int] = []

        async def charge() -> None:
            entered.set()
            await go.wait()
            made.append(1)

        exchange = Exchange(b"req_1", 0.0, "chat")
        exchange.charge = charge
        task = asyncio.create_task(settle(exchange))
        await asyncio.wait_for(entered.wait(), 10)
        cancel(task)  # as the drain deadline's cut or the disconnect watch does
        cancel(task)  # twice: still one charge, one cancellation
        await asyncio.sleep(0)  # the task runs on: nothing was thrown into the charge
        assert not task.done()
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert made == [1]
        assert exchange.charge is None

    asyncio.run(scenario())


def test_a_cancel_outside_a_charge_cancels_at_once() -> None:
    async def scenario() -> None:
        never = asyncio.Event()
        task = asyncio.create_task(never.wait())
        await asyncio.sleep(0)
        cancel(task)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert task.cancelled()

    asyncio.run(scenario())
