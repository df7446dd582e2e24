"""`Signal`: a flag that wakes one waiter, with a timeout that costs no task.

The committer of the provenance log waits once or twice per batch (for work, then for the
batch to fill). `asyncio.wait_for(event.wait(), timeout)` makes a task per wait; this is a
future and, when there is a timeout, a timer handle. Event loop only, like asyncio.Event.
"""

from __future__ import annotations

import asyncio

__all__ = ["Signal"]


class Signal:
    """Set by anyone on the loop, awaited by one waiter at a time; stays set until cleared."""

    __slots__ = ("_is_set", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._is_set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._is_set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._is_set = False

    def is_set(self) -> bool:
        return self._is_set

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until set (returns True) or until `timeout` seconds have passed (False);
        None waits without limit. Returns at once if already set."""
        if self._is_set:
            return True
        if timeout is not None and timeout <= 0:
            return False
        if self._waiter is not None:
            raise RuntimeError("a Signal has one waiter at a time")
        waiter = self._waiter = self._loop.create_future()
        timer = None if timeout is None else self._loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return self._is_set


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
