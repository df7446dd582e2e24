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
