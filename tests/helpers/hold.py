"""Holding a request at one step of the gateway while the test changes something.

`Hold(monkeypatch, owner, name)` replaces the async method `owner.name` with one that, on
its first call (`when`: its first call that `when(self, *args, **kwargs)` is true of), sets
`entered` and waits for `released` (set by the test) before running the method
(`after=True`: after it ran, before its result is returned). `across` sends a
request on a thread, runs the test's change once the request is held there, lets it go
and returns what the request came to. Every wait is on an event, bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from tests.helpers.waiting import until, until_async

__all__ = ["Hold"]

T = TypeVar("T")


class Hold:
    """`owner.name` (an async method) held on its first call until the test lets it go."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        owner: type,
        name: str,
        *,
        after: bool = False,
        when: Callable[..., bool] = lambda *_args, **_kwargs: True,
    ) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        method = getattr(owner, name)

        async def held(this: Any, *args: Any, **kwargs: Any) -> Any:
            if after:
                result = await method(this, *args, **kwargs)
            if not self.entered.is_set() and when(this, *args, **kwargs):
                self.entered.set()
                await until_async(self.released.is_set, "the test's change", timeout=60)
            return result if after else await method(this, *args, **kwargs)

        monkeypatch.setattr(owner, name, held)

    def across(self, send: Callable[[], T], change: Callable[[], None]) -> T:
        """`send()` on a thread; `change()` while it is held; what `send()` returned."""
        try:
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(send)
                until(self.entered.is_set, "the held request", timeout=30)
                change()
                self.released.set()
                return pending.result(timeout=120)
        finally:
            self.released.set()
