"""The committer's wake-up flag (gateway/provenance/writer/signal.py)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.provenance.writer.signal import Signal


def test_wait_returns_true_when_set_and_false_on_timeout() -> None:
    async def scenario() -> None:
        signal = Signal(asyncio.get_running_loop())
        assert await signal.wait(0.01) is False
        assert await signal.wait(0) is False  # no wait at all
        asyncio.get_running_loop().call_later(0.01, signal.set)
        assert await signal.wait(30) is True
        assert await signal.wait() is True  # stays set until cleared
        signal.clear()
        assert not signal.is_set()

    asyncio.run(scenario())


def test_a_set_before_the_wait_is_not_lost_and_timers_are_cancelled() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        signal = Signal(loop)
        signal.set()
        assert await signal.wait(30) is True
        signal.clear()
        waiter = asyncio.ensure_future(signal.wait(30))
        await asyncio.sleep(0)
        signal.set()
        assert await waiter is True
        # the 30 s timer was cancelled: nothing is left scheduled on the loop
        assert not [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_signal_usable() -> None:
    async def scenario() -> None:
        signal = Signal(asyncio.get_running_loop())
        waiter = asyncio.ensure_future(signal.wait())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="one waiter"):
            await signal.wait()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        asyncio.get_running_loop().call_soon(signal.set)
        assert await signal.wait(30) is True

    asyncio.run(scenario())
