"""How many turns of the event loop a task beside some work gets while the work runs:
a source whose data is all ready at once must still leave the loop turns (one per piece
or chunk), not hold it until the whole burst is parsed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def with_turns_beside(work: Awaitable[T]) -> tuple[T, int]:
    """`work`'s result, and the turns a task started before it got while it ran (its
    turns after `work` ended are not counted)."""
    turns = 0
    done = asyncio.Event()

    async def beside() -> None:
        nonlocal turns
        while not done.is_set():
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(beside())
    await asyncio.sleep(0)  # it starts
    try:
        result = await work
        seen = turns
    finally:
        done.set()
        await task
    return result, seen
