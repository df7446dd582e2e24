"""The line the log's reads wait in past their bounds (gateway/admin/read_line.py): first
come first served within a token, fair across tokens, bounded in length and in wait.

Table-free, step by step on one event loop: two threads in all, two of one token's."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admin.read_line import ReadLine
from gateway.errors import ErrorCode, GatewayError


def _line(wait_s: float = 60.0) -> ReadLine:
    return ReadLine(
        2, 2, most_waiting=4, per_owner_waiting=3, wait_s=wait_s, refusal=lambda why: why
    )


async def _settle() -> None:
    for _ in range(3):  # a granted waiter's task runs within a few loop turns
        await asyncio.sleep(0)


def test_a_freed_thread_goes_to_the_token_holding_fewest_then_first_come() -> None:
    """`a` holds both threads and has three reads waiting; `b` arrives after them. The
    first thread `a` frees is `b`'s (it holds none), the next `a`'s oldest waiting read;
    `a`'s fourth waiting read is refused at once (its share of the line)."""

    async def run() -> None:
        line = _line()
        order: list[str] = []

        async def read(owner: str, name: str) -> None:
            await line.take(owner)
            order.append(name)

        await line.take("a")
        await line.take("a")
        waiting = [asyncio.create_task(read("a", f"a{i}")) for i in range(3)]
        await _settle()
        assert line.waiting("a") == 3
        with pytest.raises(GatewayError) as refused:
            await line.take("a")
        assert refused.value.code is ErrorCode.rate_limit_exceeded
        assert refused.value.message == "owner_line"
        b = asyncio.create_task(read("b", "b"))
        await _settle()
        assert line.waiting() == 4 and not order

        line.give_back("a")
        await _settle()
        assert order == ["b"]
        line.give_back("a")
        await _settle()
        assert order == ["b", "a0"]
        line.give_back("b")
        await _settle()
        assert order == ["b", "a0", "a1"]
        line.give_back("a")
        await asyncio.gather(b, *waiting)
        assert order == ["b", "a0", "a1", "a2"]
        assert line.held("a") == 2 and line.waiting() == 0

    asyncio.run(run())


def test_a_full_line_refuses_and_a_read_that_waited_too_long_is_429() -> None:
    async def run() -> None:
        line = _line(wait_s=0.0)
        await line.take("a")
        await line.take("a")
        with pytest.raises(GatewayError) as waited:
            await line.take("b")  # no thread comes free: refused at its deadline
        assert waited.value.message == "waited"
        assert line.waiting() == 0 and line.held("b") == 0

        patient = _line()
        await patient.take("a")
        await patient.take("a")
        held = [asyncio.create_task(patient.take(who)) for who in ("b", "c", "d", "e")]
        await _settle()
        with pytest.raises(GatewayError) as full:
            await patient.take("f")
        assert full.value.message == "line"
        for task in held:  # a waiter that leaves (its client gone) holds nothing
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        assert patient.waiting() == 0
        patient.give_back("a")
        await patient.take("f")
        assert patient.held("f") == 1

    asyncio.run(run())
