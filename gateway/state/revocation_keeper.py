"""A state's side of this host's revoked keys list (revocation_list.py).

`KeptRevocations` reads the list when it is made (as the state is built, before the
first request: a list that cannot be read raises `RevocationListError` and the gateway
does not start), and writes the revocations the state makes or learns from Redis since,
off the request path: `flush_soon` (the Redis sync loop, a background task at most one
at a time), `flush` (a revocation made here: written before the call returns), `close`.
A write that fails is logged once until one succeeds again and retried `RETRY_S` later;
the revocations stay enforced in the process meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from gateway.keys_file import DIGEST
from gateway.logs import get_logger
from gateway.state.revocation_list import (
    RevocationListError,
    add_revocations,
    read_revocations,
)

__all__ = ["RETRY_S", "KeptRevocations"]

RETRY_S: Final = 5.0  # after a failed write, the next try of the sync loop's


class KeptRevocations:
    """The digests the list held at start (`known`) and those to write to it since."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        try:
            self.known = read_revocations(path)
        except RevocationListError as exc:  # fail closed: never start without what it held
            raise RevocationListError(
                f"revoked keys list {exc}; not starting without the revocations it may hold "
                "(restore it, or remove it to start from what the keys and Redis say)"
            ) from None
        self._clock = clock
        self._unwritten: set[str] = set()
        self._retry_at = 0.0
        self._failing = False
        self._task: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None  # made in the loop that first writes
        self._log = get_logger("owngate.state")

    @property
    def unwritten(self) -> int:
        """Revocations made or learned here that the list does not hold yet."""
        return len(self._unwritten)

    def note(self, digests: Iterable[str]) -> None:
        """Revocations this process made or learned: to be written. Raises ValueError
        for one that is no key digest (it would make every write of the batch fail)."""
        batch = set(digests)
        if not all(DIGEST.match(d) for d in batch):
            raise ValueError("a revoked keys list holds key digests only (sha256: and 64 hex)")
        self._unwritten |= batch

    def flush_soon(self) -> None:
        """Write what is noted in a background task (none while one runs, or before the
        retry time after a failure)."""
        if not self._unwritten or self._task is not None or self._clock() < self._retry_at:
            return
        self._task = asyncio.create_task(self.flush(), name="owngate-revocation-list")
        self._task.add_done_callback(self._flushed)

    def _flushed(self, _task: asyncio.Task[None]) -> None:
        self._task = None

    async def flush(self) -> None:
        """Write what is noted now (one write at a time); a failure is logged, not raised."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            batch = set(self._unwritten)
            if not batch:
                return
            try:
                await asyncio.to_thread(add_revocations, self.path, batch)
            except (OSError, ValueError) as exc:  # RevocationListError is a ValueError
                self._retry_at = self._clock() + RETRY_S
                if not self._failing:
                    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                    self._log.error(
                        "revoked keys list not written; revocations made or learned here "
                        "hold in this process only until it is",
                        path=str(self.path),
                        unwritten=len(self._unwritten),
                        reason=str(reason),
                    )
                self._failing = True
                return
            self._unwritten -= batch
            if self._failing:
                self._log.info("revoked keys list written again", path=str(self.path))
            self._failing = False

    async def close(self) -> None:
        """Wait for a write in progress, then write what is left (at shutdown)."""
        task = self._task
        if task is not None:
            await asyncio.wait({task})
        await self.flush()
