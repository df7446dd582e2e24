"""Calling a reader that may block opening a FIFO, with a guard that ends the wait.

A reader that opens a FIFO without O_NONBLOCK waits for a writer for ever. `call_guarded`
runs it on a thread and, when it has not returned within the guard, opens the FIFO's
writing end (bounded tries) so that the thread ends and no test leaves one behind; the
test then fails saying the reader blocked.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["HANG_GUARD_S", "call_guarded"]

HANG_GUARD_S = 10.0  # a reader that refuses a FIFO returns in milliseconds


def call_guarded(call: Callable[[], object], fifo: Path) -> Exception | None:
    """What `call()` raised (None when it returned); AssertionError when it blocked for
    `HANG_GUARD_S` seconds (the FIFO then released by opening its writing end)."""
    raised: list[Exception] = []

    def run() -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 (handed to the test, which judges it)
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    blocked = thread.is_alive()
    for _ in range(1000):  # bounded: each blocked open waits for one writer
        if not thread.is_alive():
            break
        with contextlib.suppress(OSError):  # ENXIO: no open is waiting right now
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(0.05)
    if blocked:
        raise AssertionError(f"blocked opening the FIFO {fifo} for {HANG_GUARD_S} s")
    return raised[0] if raised else None
