"""A state's side of this host's revoked keys list (revocation_list.py).

`KeptRevocations` reads the list when it is made (as the state is built, before the
first request: a list that cannot be read raises `RevocationListError` and the gateway
does not start), and writes the revocations the state makes or learns from Redis since,
off the request path: `flush_soon` (the Redis sync loop, a background task at most one
at a time), `flush` (a revocation made here: written before the call returns), `close`.
A write that fails is logged once until one succeeds again and retried `RETRY_S` later;
the revocations stay enforced in the process meanwhile. A revocation learned from Redis
is handed to `listed` (and only then enforced: redis_revocations.py) once a write of it
ends, written or failed, so what a process refused is on the list should it die next.

`watch` reads the list again in a background task, every `WATCH_S`, when its inode,
size, mtime or ctime moved (one `stat` a look, off the request path): what another
process wrote (`owngate keys revoke` without Redis, a sibling worker, another gateway on
the host) reaches `listed` within about a look. A list found damaged or unreadable while
running sets `damaged` (logged once, until a read succeeds again): the state then
refuses every tenant request (503, gateway/api/tenant_auth.py) rather than serve keys
the list may revoke, and says why; each look reads it again (restored, or removed). A
look that fails otherwise (a bug) does too, and the watch goes on: before, it ended the
watch task without a word, and the process never read the list again.
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
    LOCK_WAIT_S,
    RevocationListError,
    add_revocations,
    read_revocations,
)

__all__ = ["RETRY_S", "WATCH_S", "KeptRevocations"]

RETRY_S: Final = 5.0  # after a failed write, the next try of the sync loop's
WATCH_S: Final = 1.0  # between two looks at the list (the config files' poll interval)

Stamp = tuple[int, int, int, int] | None  # inode, size, mtime, ctime; None: no file


class KeptRevocations:
    """The digests the list held at start (`known`) and those to write to it since.
    `listed` gets the digests a write attempt ended for, and those a look found (the
    state sets it: `MemoryState`, `RedisState`)."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        watch_s: float = WATCH_S,
        lock_wait_s: float = LOCK_WAIT_S,
    ) -> None:
        self.path = path
        try:
            self._stamp = _stamp(path)  # before the read: a change meanwhile is read again
            self.known = read_revocations(path)
        except RevocationListError as exc:  # fail closed: never start without what it held
            raise RevocationListError(
                f"revoked keys list {exc}; not starting without the revocations it may hold "
                "(restore it, or remove it to start from what the keys and Redis say)"
            ) from None
        self.listed: Callable[[frozenset[str]], None] = lambda digests: None
        self.damaged: str | None = None  # why the list read while running could not be
        self._clock = clock
        self._watch_s = watch_s
        self._lock_wait_s = lock_wait_s
        self._unwritten: set[str] = set()
        self._retry_at = 0.0
        self._failing = False
        self._task: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None  # made in the loop that first writes
        self._log = get_logger("owngate.state")

    @property
    def unwritten(self) -> int:
        """Revocations made or learned here that the list does not hold yet."""
        return len(self._unwritten)

    def note(self, digests: Iterable[str]) -> None:
        """Revocations this process made or learned: to be written. Raises ValueError
        for one that is no key digest (it would make every write of the batch fail).
        While writes fail (before the retry time), `listed` gets them at once: a process
        never waits for a list it cannot write to refuse a key."""
        batch = set(digests)
        if not all(DIGEST.match(d) for d in batch):
            raise ValueError("a revoked keys list holds key digests only (sha256: and 64 hex)")
        self._unwritten |= batch
        if batch and self._failing and self._clock() < self._retry_at:
            self.listed(frozenset(batch))

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
        """Write what is noted now (one write at a time); a failure is logged, not raised.
        `listed` gets the batch either way."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            batch = set(self._unwritten)
            if not batch:
                return
            try:
                await asyncio.to_thread(add_revocations, self.path, batch, wait_s=self._lock_wait_s)
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
                self.listed(frozenset(self._unwritten))  # enforced, written or not
                return
            self._unwritten -= batch
            self.known |= batch
            if self._failing:
                self._log.info("revoked keys list written again", path=str(self.path))
            self._failing = False
            self.listed(frozenset(batch))

    def watch(self) -> None:
        """Look at the list every `watch_s` in a background task, until `close`."""
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="owngate-revocation-watch")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._watch_s)
            try:
                await self.look()
            except Exception as exc:  # noqa: BLE001 - a bug: logged, fails closed, watch goes on
                if self.damaged is None:
                    self._log.error("revoked keys list look failed", exc_info=exc)
                self.damaged = f"{self.path}: the look at it failed ({type(exc).__name__})"

    async def look(self) -> frozenset[str]:
        """Read the list again if it changed since the last read (or the last failed);
        the digests it holds that this process did not know, handed to `listed` too."""
        try:
            digests = await asyncio.to_thread(self._read_if_changed)
        except RevocationListError as exc:
            if self.damaged is None:
                self._log.error(
                    "revoked keys list cannot be read; refusing every tenant request until "
                    "it can (restore it, or remove it: the revocations known stay)",
                    reason=str(exc),
                )
            self.damaged = str(exc)
            return frozenset()
        fresh = frozenset() if digests is None else digests - self.known
        if fresh:
            self.listed(fresh)  # first: should it raise, the next look hands them again
            self.known |= fresh
        if self.damaged is not None:
            self._log.info("revoked keys list read again", path=str(self.path))
            self.damaged = None
        return fresh

    def _read_if_changed(self) -> frozenset[str] | None:
        """The list's digests (None: unchanged since the last read that succeeded)."""
        stamp = _stamp(self.path)
        if stamp == self._stamp and self.damaged is None:
            return None
        digests = read_revocations(self.path)
        self._stamp = stamp
        return digests

    async def close(self) -> None:
        """Stop watching, wait for a write in progress, then write what is left (at
        shutdown)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.wait({watcher})
        task = self._task
        if task is not None:
            await asyncio.wait({task})
        await self.flush()


def _stamp(path: Path) -> Stamp:
    """What tells a changed list: a rename (inode), any write (size, mtime, ctime)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RevocationListError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
