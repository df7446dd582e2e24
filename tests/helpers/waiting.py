"""Waiting for a condition, never for a sleep to be long enough.

A test that waits for something another thread, task or process does polls a condition
with `until` (or `until_async` inside an event loop): it returns as soon as the condition
holds and fails the test, naming what it awaited, once `timeout` seconds pass without it.
A busy machine makes the wait longer, never the test wrong: the default bound, 30 s, only
ends a hang. (It was 10 s: little room on a machine running the whole suite in one
process beside other jobs, where a subprocess's start or LiteLLM's import takes seconds;
a wait that holds returns at once, so the bound costs a passing test nothing.)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

__all__ = ["DEFAULT_TIMEOUT_S", "until", "until_async"]

DEFAULT_TIMEOUT_S = 30.0  # bounds a hang only


def until(
    condition: Callable[[], bool],
    what: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.01,
    detail: Callable[[], object] | None = None,
) -> float:
    """Call `condition` every `interval` seconds until it holds; the seconds that took.

    Raises AssertionError "not within <timeout>s: <what>" when it still does not hold
    after `timeout` seconds (it is asked once more at the deadline); `detail()`, when
    given, is appended to that message (say, the state the condition read).
    """
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started >= timeout:
            raise AssertionError(_failure(what, timeout, detail))
        time.sleep(interval)
    return time.monotonic() - started


async def until_async(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.01,
    detail: Callable[[], object] | None = None,
) -> float:
    """`until` in an event loop: the loop runs other tasks while this one waits.

    `condition` may be a coroutine function (awaited at each look). `interval` 0 only
    yields to the loop between looks: for tasks driven by a virtual clock, which move at
    every turn of the loop however little real time passes.
    """
    started = time.monotonic()
    while not await _holds(condition):
        if time.monotonic() - started >= timeout:
            raise AssertionError(_failure(what, timeout, detail))
        await asyncio.sleep(interval)
    return time.monotonic() - started


async def _holds(condition: Callable[[], bool | Awaitable[bool]]) -> bool:
    result = condition()
    return bool(await result) if inspect.isawaitable(result) else bool(result)


def _failure(what: str, timeout: float, detail: Callable[[], object] | None) -> str:
    message = f"not within {timeout:g}s: {what}"
    return f"{message} ({detail()})" if detail is not None else message
