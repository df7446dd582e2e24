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

Each look runs in a thread of its own and is bounded (`LOOK_LIMIT_S`): one not ended by
then (a hung filesystem: a hard NFS mount whose `stat` or `read` blocks for good) sets
`damaged` too, and no other look starts until it ends (its result is taken then). Before,
the hung look held the watch for good without a word: what was revoked later was never
enforced. A look that could not open the list for want of a host resource (`EMFILE`,
`ENFILE`: `RevocationListUnavailable`) keeps the last good list, logs the errno once and
reads it again at each look; only when that lasts `LOOK_LIMIT_S` is the list `damaged`.
Before, one such look refused every tenant request and told the operator to restore a
list that was fine. A list that lacks digests it held (an older copy restored, or
removed: `rollbacks` counts the looks that found so) is logged as an error and the
missing digests are written back (`note`): this process never drops one, and a process
started here later (a worker started again, a restart while Redis is down) refuses them
too (a look under way as this process wrote them cannot tell: the next reads again).
Before, the process kept refusing them but never wrote them back: the next start
served the keys again.

A write that has not ended within its lock wait and `LOOK_LIMIT_S` (a hung filesystem:
`stat` answered from a cache while writes block) counts as one that failed for what it
holds back: `listed` gets its revocations, and those noted until it ends, at once
(logged). Before, a revocation learned from Redis waited for that write for good: the
key stayed served here while every other replica refused it. The write itself, an admin
revocation's answer and the shutdown still wait for it (not bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from gateway.keys_file import DIGEST
from gateway.logs import get_logger
from gateway.state.revocation_list import (
    LOCK_WAIT_S,
    RevocationListError,
    RevocationListUnavailable,
    add_revocations,
    read_revocations,
    unavailable,
)

__all__ = ["LOOK_LIMIT_S", "RETRY_S", "WATCH_S", "KeptRevocations"]

RETRY_S: Final = 5.0  # after a failed write, the next try of the sync loop's
WATCH_S: Final = 1.0  # between two looks at the list (the config files' poll interval)
# A look (a `stat`, a read of at most 14 MB) not ended by then, or a list the host could
# not open for that long (out of descriptors): the list counts as damaged.
LOOK_LIMIT_S: Final = 5.0

Stamp = tuple[int, int, int, int] | None  # inode, size, mtime, ctime; None: no file
Read = tuple[Stamp, frozenset[str]] | None  # a look's read: None when the list is unchanged


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
        look_limit_s: float | None = None,  # LOOK_LIMIT_S, as it is when made
    ) -> None:
        self.path = path
        try:
            self._stamp = _stamp(path)  # before the read: a change meanwhile is read again
            self.known = read_revocations(path)
        except RevocationListUnavailable as exc:  # the host's want, not the list's damage
            raise RevocationListError(
                f"revoked keys list {exc}; not starting without the revocations it may hold "
                "(the host is out of file descriptors or memory: start again once it is not)"
            ) from None
        except RevocationListError as exc:  # fail closed: never start without what it held
            raise RevocationListError(
                f"revoked keys list {exc}; not starting without the revocations it may hold "
                "(restore it, or remove it to start from what the keys and Redis say)"
            ) from None
        self.listed: Callable[[frozenset[str]], None] = lambda digests: None
        self.damaged: str | None = None  # why the list read while running could not be
        self.rollbacks = 0  # looks that found the list lacking digests it held
        self._clock = clock
        self._watch_s = watch_s
        self._look_limit_s = LOOK_LIMIT_S if look_limit_s is None else look_limit_s
        self._reading: asyncio.Future[Read] | None = None
        self._held: frozenset[str] = frozenset()  # `known` as the read in progress began
        self._recheck = False  # the last read could not tell all it lost: read again
        self._unavailable_since: float | None = None  # first look the host could not open it
        self._lock_wait_s = lock_wait_s
        self._unwritten: set[str] = set()
        self._retry_at = 0.0
        self._failing = False
        self._stalled = False  # a write has not ended within its bound (`_bounded`)
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
        While writes fail (before the retry time), or one has not ended within its bound
        (`_bounded`), `listed` gets them at once: a process never waits for a list it
        cannot write to refuse a key."""
        batch = set(digests)
        if not all(DIGEST.match(d) for d in batch):
            raise ValueError("a revoked keys list holds key digests only (sha256: and 64 hex)")
        self._unwritten |= batch
        if batch and (self._stalled or (self._failing and self._clock() < self._retry_at)):
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
            write = asyncio.ensure_future(
                asyncio.to_thread(add_revocations, self.path, batch, wait_s=self._lock_wait_s)
            )
            try:
                await self._bounded(write)
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

    async def _bounded(self, write: asyncio.Future[int]) -> None:
        """Wait for `write`; one not ended within its lock wait and `look_limit_s` (a
        hung filesystem) no longer holds up the revocations: `listed` gets them, and
        those noted until it ends, at once (a hung write is one that failed)."""
        try:
            done, _ = await asyncio.wait({write}, timeout=self._lock_wait_s + self._look_limit_s)
        except asyncio.CancelledError:
            write.cancel()  # as an awaited write would be (its thread runs on)
            raise
        if not done:
            self._stalled = True
            self._log.error(
                "revoked keys list write has not ended; revocations made or learned here "
                "are refused now, and hold in this process only until it ends (the "
                "filesystem holding it may hang)",
                path=str(self.path),
                unwritten=len(self._unwritten),
            )
            self.listed(frozenset(self._unwritten))
        try:
            await write
        finally:
            self._stalled = False

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
        the digests it holds that this process did not know, handed to `listed` too.
        Waits at most `look_limit_s` for the read (module docstring)."""
        if self._reading is None:
            self._held = frozenset(self.known)  # what a list read from now on must hold
            self._reading = self._read_in_thread(force=self._must_read())
        reading = self._reading
        done, _ = await asyncio.wait({reading}, timeout=self._look_limit_s)
        if not done:  # still reading: the next look waits for the same read
            self._damage(
                f"{self.path}: a look at it has not ended within {self._look_limit_s:g} s "
                "(a hung filesystem?)",
                "revoked keys list look has not ended; refusing every tenant request "
                "until one does (the filesystem holding it may hang)",
            )
            return frozenset()
        self._reading = None
        try:
            read = reading.result()
        except RevocationListUnavailable as exc:
            self._unavailable(exc)
            return frozenset()
        except RevocationListError as exc:
            self._damage(
                str(exc),
                "revoked keys list cannot be read; refusing every tenant request until it "
                "can (restore it, or remove it: the revocations known stay)",
            )
            return frozenset()
        self._unavailable_since = None
        fresh = frozenset() if read is None else self._taken(*read)
        if self.damaged is not None:
            self._log.info("revoked keys list read again", path=str(self.path))
            self.damaged = None
        self.flush_soon()  # what it lost, or a write that failed: tried again (RETRY_S)
        return fresh

    def _taken(self, stamp: Stamp, digests: frozenset[str]) -> frozenset[str]:
        """What a read found: the digests new here handed over, those it lost written
        back (never dropped here)."""
        fresh = digests - self.known
        if fresh:
            self.listed(fresh)  # first: should it raise, the next look hands them again
            self.known |= fresh
        self._stamp = stamp
        # Written here while it read (or written, then lost to an older copy restored
        # before it read): read again at the next look, whose `_held` holds them.
        self._recheck = bool(self.known - self._held - digests)
        lost = self._held - digests  # held as the read began: on the list then, or before
        if lost:
            self.rollbacks += 1
            self._log.error(
                "revoked keys list lacks revocations it held (an older copy restored, or "
                "removed); they stay refused here and are written back",
                path=str(self.path),
                lost=len(lost),
            )
            self.known -= lost  # on the list again once written (`flush`)
            self._unwritten |= lost
        return fresh

    def _must_read(self) -> bool:
        failing = self.damaged is not None or self._unavailable_since is not None
        return failing or self._recheck

    def _damage(self, reason: str, event: str) -> None:
        if self.damaged is None:
            self._log.error(event, reason=reason)
        self.damaged = reason

    def _unavailable(self, exc: RevocationListUnavailable) -> None:
        """The host could not open the list now: the last good one stays, unless that
        has lasted `look_limit_s`."""
        now = self._clock()
        if self._unavailable_since is None:
            self._unavailable_since = now
            self._log.warning(
                "revoked keys list cannot be opened now; the revocations known stay "
                "refused, and it is read again at the next look",
                path=str(self.path),
                errno=exc.errno_name,
            )
        elif now - self._unavailable_since >= self._look_limit_s:
            self._damage(
                f"{exc} for {self._look_limit_s:g} s",
                "revoked keys list cannot be opened; refusing every tenant request until "
                "it can (the host is out of file descriptors or memory)",
            )

    def _read_in_thread(self, *, force: bool) -> asyncio.Future[Read]:
        """`_read_if_changed` in a daemon thread of its own: one that never ends (a hung
        filesystem) neither holds a worker of the loop's executor nor the process's exit."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Read] = loop.create_future()

        def settle(result: Read, error: BaseException | None) -> None:
            if future.done():  # cancelled (the loop closing)
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def read() -> None:
            result: Read = None
            error: BaseException | None = None
            try:
                result = self._read_if_changed(force)
            except BaseException as exc:  # noqa: BLE001 - handed to the look, raised there
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed while it read
                loop.call_soon_threadsafe(settle, result, error)

        try:
            threading.Thread(target=read, name="owngate-revocation-look", daemon=True).start()
        except RuntimeError:  # no thread to be had: the host's want, as EMFILE
            future.set_exception(
                RevocationListUnavailable(f"{self.path}: no thread to read it now", "EAGAIN")
            )
        return future

    def _read_if_changed(self, force: bool) -> Read:
        """The list's stamp and digests (None: unchanged since the last read that
        succeeded, and `force` false). Runs in the look's thread: reads `_stamp` only."""
        stamp = _stamp(self.path)
        if stamp == self._stamp and not force:
            return None
        return stamp, read_revocations(self.path)

    async def close(self) -> None:
        """Stop watching, wait for a write in progress, then write what is left (at
        shutdown)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.wait({watcher})
        if self._reading is not None:  # a look still reading (hung): nobody waits for it
            self._reading.cancel()
            self._reading = None
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
        if (transient := unavailable(path, exc)) is not None:
            raise transient from None
        raise RevocationListError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
