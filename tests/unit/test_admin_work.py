"""The admin API's worker threads and their bound (gateway/admin/work.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.admin.work import AdminWork
from gateway.errors import ErrorCode, GatewayError
from tests.helpers.waiting import until_async


def test_calls_past_a_callers_share_or_the_threads_are_429_at_once() -> None:
    work = AdminWork(threads=3, per_caller=2)
    gate = threading.Event()

    async def run() -> None:
        held = [asyncio.ensure_future(work.run(c, gate.wait, 10)) for c in ("a", "a", "b")]
        await until_async(lambda: work.running("a") == 2 and work.running("b") == 1, "admitted")
        for caller, limit in (("a", "as many as one token may"), ("c", "as many as it runs")):
            with pytest.raises(GatewayError) as refused:
                await work.run(caller, gate.wait, 10)
            assert refused.value.code is ErrorCode.rate_limit_exceeded
            assert refused.value.status == 429
            assert refused.value.headers == ((b"retry-after", b"1"),)
            assert limit in refused.value.message
        gate.set()
        assert await asyncio.gather(*held) == [True, True, True]
        await until_async(lambda: work.running("a") == 0, "the calls done")
        assert await work.run("c", sum, (1, 2)) == 3  # room again
        work.shutdown()

    asyncio.run(run())


def test_a_call_whose_request_left_counts_until_its_thread_is_done() -> None:
    work = AdminWork(threads=1, per_caller=1)
    gate = threading.Event()

    async def run() -> None:
        running = asyncio.ensure_future(work.run("a", gate.wait, 10))
        await until_async(lambda: work.running("a") == 1, "admitted")
        running.cancel()  # the client left; the thread still reads
        with pytest.raises(asyncio.CancelledError):
            await running
        with pytest.raises(GatewayError):  # its thread is still taken
            await work.run("b", gate.wait, 10)
        gate.set()
        await until_async(lambda: work.running("a") == 0, "the thread done with it")
        assert await work.run("b", sum, (2, 2)) == 4
        work.shutdown()

    asyncio.run(run())


def test_a_failing_call_raises_its_error_and_frees_its_place() -> None:
    work = AdminWork(threads=1, per_caller=1)

    def fails() -> None:
        raise ValueError("unreadable")

    async def run() -> None:
        for _ in range(3):  # a leak would refuse the next round
            with pytest.raises(ValueError, match="unreadable"):
                await work.run("a", fails)
            await until_async(lambda: work.running("a") == 0, "freed")
        work.shutdown()

    asyncio.run(run())
