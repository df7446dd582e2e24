"""`SaturationQueue`: with several tenants, one tenant's waiters take at most its part of
a pool's queue (`queue.size_per_tenant`, half of `size` by default)."""

from __future__ import annotations

import asyncio

import pydantic
import pytest

from gateway.config.routing import QueueSettings
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.saturation import SaturationQueue


def test_a_tenants_part_is_half_the_queue_unless_set() -> None:
    assert QueueSettings().tenant_size == 128
    assert QueueSettings(size=1).tenant_size == 1  # one waiter at least
    assert QueueSettings(size=4, size_per_tenant=4).tenant_size == 4  # the former behaviour
    assert QueueSettings(size=4, size_per_tenant=9).tenant_size == 4  # never past the queue
    with pytest.raises(pydantic.ValidationError):
        QueueSettings(size_per_tenant=0)


def test_one_tenants_waiters_leave_the_others_room() -> None:
    async def run() -> None:
        queue = SaturationQueue("m", QueueSettings(size=5, max_wait_s=60))
        waiters = [
            asyncio.create_task(queue.wait(lambda: True, 60, tenant))
            for tenant in ("a", "a", None, "b")
        ]
        await asyncio.sleep(0)  # one loop turn: each task runs to its wait, in order
        assert queue.waiting == 4
        with pytest.raises(GatewayError) as refused:
            await queue.wait(lambda: True, 60, "a")  # a's third: past its part (2), one place free
        assert refused.value.code is ErrorCode.rate_limit_exceeded
        assert "queue.size_per_tenant" in refused.value.message
        assert queue.waiting == 4  # the refusal took no place
        for _ in waiters:
            queue.release()
        await asyncio.gather(*waiters)
        assert queue.waiting == 0 and queue._by_tenant == {}  # no entry kept per tenant

    asyncio.run(run())


def test_two_tenants_at_their_parts_fill_the_queue_for_a_third() -> None:
    """A tenant's part bounds that tenant, not how many tenants share the queue: with the
    default (half of `size`), two tenants at their parts fill it and a third tenant's
    request is refused as for a full queue (docs/security.md says so; it said "the others
    always find a place")."""

    async def run() -> None:
        queue = SaturationQueue("m", QueueSettings(size=4, max_wait_s=60))
        waiters = [
            asyncio.create_task(queue.wait(lambda: True, 60, tenant))
            for tenant in ("a", "a", "b", "b")
        ]
        await asyncio.sleep(0)  # one loop turn: each task runs to its wait, in order
        assert queue.waiting == 4
        with pytest.raises(GatewayError) as refused:
            await queue.wait(lambda: True, 60, "c")  # c holds nothing: the queue is full
        assert refused.value.code is ErrorCode.rate_limit_exceeded
        assert "queue for it is full" in refused.value.message
        for _ in waiters:
            queue.release()
        await asyncio.gather(*waiters)

    asyncio.run(run())


async def release_one(queue: SaturationQueue, order: list[str]) -> None:
    """Free one slot and let the waiter it released run on (a few loop turns: the waiter
    is shielded under a timeout), so that `order` is the order of release."""
    served = len(order)
    queue.release()
    for _ in range(100):
        if len(order) > served:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"no waiter went on after a release; went: {order}")


def test_a_slot_goes_to_the_tenant_served_least_recently_not_the_oldest_waiter() -> None:
    """Tenant `a` queues 4 requests, then `b` queues 1. The queue let them go first come,
    first served, so `b` waited behind all of `a`'s burst (fifth); now a freed slot goes
    round-robin across the tenants with waiters, first come first served within one:
    `b` goes second."""

    async def run() -> None:
        queue = SaturationQueue("m", QueueSettings(size=10, max_wait_s=60))
        order: list[str] = []

        async def request(name: str, tenant: str) -> None:
            await queue.wait(lambda: True, 60, tenant)
            order.append(name)

        tasks = [
            asyncio.create_task(request(name, name[0])) for name in ("a1", "a2", "a3", "a4", "b1")
        ]
        await asyncio.sleep(0)  # one loop turn: each task runs to its wait, in order
        assert queue.waiting == 5
        for released in range(1, 6):
            await release_one(queue, order)
            assert len(order) == released and queue.waiting == 5 - released
        await asyncio.gather(*tasks)
        assert order == ["a1", "b1", "a2", "a3", "a4"]
        assert queue._by_tenant == {}

    asyncio.run(run())


def test_tenants_take_turns_and_a_tenant_coming_back_joins_the_end_of_the_round() -> None:
    """Three tenants and tenant-less requests (None, one turn of their own) take turns;
    a tenant whose last waiter went and that queues again joins the round at its end,
    so coming and going does not put it ahead of the tenants that kept waiting."""

    async def run() -> None:
        queue = SaturationQueue("m", QueueSettings(size=12, size_per_tenant=4, max_wait_s=60))
        order: list[str] = []

        async def request(name: str, tenant: str | None) -> None:
            await queue.wait(lambda: True, 60, tenant)
            order.append(name)

        def join(*names: str) -> None:
            for name in names:
                tenant = None if name[0] == "n" else name[0]
                tasks.append(asyncio.create_task(request(name, tenant)))

        tasks: list[asyncio.Task[None]] = []
        join("a1", "a2", "a3", "b1", "c1", "c2", "n1", "n2")
        await asyncio.sleep(0)
        for _ in range(3):
            await release_one(queue, order)
        assert order == ["a1", "b1", "c1"]
        join("b2")  # b's only waiter went: b comes back behind n, a and c
        await asyncio.sleep(0)
        for _ in range(6):
            await release_one(queue, order)
        await asyncio.gather(*tasks)
        assert order == ["a1", "b1", "c1", "n1", "a2", "c2", "b2", "n2", "a3"]

    asyncio.run(run())


def test_a_waiter_that_gives_up_leaves_its_tenants_turn_to_its_next_waiter() -> None:
    """A cancelled waiter (its client left) or one past `max_wait_s` takes no release:
    the next release goes to the next tenant in the round, and a tenant whose only
    waiter gave up leaves the round (no entry kept)."""

    async def run() -> None:
        queue = SaturationQueue("m", QueueSettings(size=10, max_wait_s=60))
        order: list[str] = []

        async def request(name: str, tenant: str) -> None:
            await queue.wait(lambda: True, 60, tenant)
            order.append(name)

        tasks = {n: asyncio.create_task(request(n, n[0])) for n in ("a1", "a2", "b1", "c1")}
        await asyncio.sleep(0)
        tasks["a1"].cancel()
        tasks["b1"].cancel()
        await asyncio.gather(tasks["a1"], tasks["b1"], return_exceptions=True)
        assert queue.waiting == 2 and list(queue._turns) == ["a", "c"]
        await release_one(queue, order)
        await release_one(queue, order)
        await asyncio.gather(tasks["a2"], tasks["c1"])
        assert order == ["a2", "c1"]
        assert queue.waiting == 0 and not queue._turns and queue._by_tenant == {}

    asyncio.run(run())


def test_waiters_past_max_wait_s_leave_the_round() -> None:
    """A wait past `max_wait_s` still answers 503 `backend_unavailable`, and its tenant
    leaves the round once it has no waiter left."""

    async def run() -> None:
        queue = SaturationQueue("m", QueueSettings(size=4, max_wait_s=0.01))
        results = await asyncio.gather(
            *(queue.wait(lambda: True, 60, tenant) for tenant in ("a", "b", None)),
            return_exceptions=True,
        )
        for result in results:
            assert isinstance(result, GatewayError), result
            assert result.code is ErrorCode.backend_unavailable
        assert queue.waiting == 0 and not queue._turns and queue._by_tenant == {}
        queue.release()  # nobody waits: nothing to let go, nothing kept

    asyncio.run(run())


def test_a_waiter_released_as_its_client_leaves_hands_the_slot_to_the_next_in_turn() -> None:
    """A waiter let go just as its task is cancelled passes the freed slot on: to the
    next tenant in the round, not lost, and its own tenant's next waiter keeps its place."""

    async def run() -> None:
        queue = SaturationQueue("m", QueueSettings(size=10, max_wait_s=60))
        order: list[str] = []

        async def request(name: str, tenant: str) -> None:
            await queue.wait(lambda: True, 60, tenant)
            order.append(name)

        tasks = {n: asyncio.create_task(request(n, n[0])) for n in ("a1", "a2", "b1")}
        await asyncio.sleep(0)
        queue.release()  # a1's turn ...
        tasks["a1"].cancel()  # ... but its client leaves before it runs on
        await asyncio.gather(tasks["a1"], return_exceptions=True)
        await asyncio.gather(tasks["b1"])  # the slot went on, to b
        assert order == ["b1"] and queue.waiting == 1
        await release_one(queue, order)
        await tasks["a2"]
        assert order == ["b1", "a2"] and not queue._turns and queue._by_tenant == {}

    asyncio.run(run())
