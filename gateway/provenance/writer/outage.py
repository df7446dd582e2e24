"""The provenance log's state while its disk refuses writes.

A failed write is reported (`error`: readiness says so, appenders get it) and the disk is
tried again `probe_interval_ms` later, so the log becomes writable again without traffic
(a replica that is not ready gets none). Records nobody waits on (`append_soon`: a
request's completion, after its answer went out) that a failed write refused are not
dropped: they are kept, at most `max_retained` (the oldest beyond that fail), and written
first once a write or a probe succeeds again; at `close` they get one last try. The
outage's start and end are each reported once (`FaultEvents`).

A write that does not return (a hung disk or network mount) is an outage too, once it
has run `stall_after_s`: it shows as the error, and new awaited appends are refused at
once instead of queueing behind it; what the write carries still lands if it returns.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable

from gateway.provenance.errors import LogUnavailableError, ProvenanceError
from gateway.provenance.formats.records import LogEntry
from gateway.provenance.writer.checkpointer import LogSettings
from gateway.provenance.writer.events import FaultEvents
from gateway.provenance.writer.queued import Queued

__all__ = ["Outage", "Withdrawing"]


class Outage:
    """Whether the disk refuses writes now, when to try it again, and what it refused."""

    def __init__(self, settings: LogSettings, events: FaultEvents | None = None) -> None:
        self.error: ProvenanceError | None = None  # of the last write, until one succeeds
        self.probe_at: float | None = None  # (loop time) when to try the disk again
        self.writing_since: float | None = None  # (loop time) the write in progress began
        self._stall_after_s = settings.stall_after_ms / 1000.0
        self._probe_interval_s = settings.probe_interval_ms / 1000.0
        self._limit = settings.max_retained
        self._stall: ProvenanceError | None = None  # the error a stall was reported as
        self._kept: list[Queued] = []
        self._events = events

    def current(self, now: float) -> ProvenanceError | None:
        """The error now: the last write's, or that of a write that has stalled."""
        return self.stalled(now) or self.error

    def stalled(self, now: float) -> ProvenanceError | None:
        """The error of a write (or probe) that has not returned for `stall_after_s`,
        reported once; None while none has."""
        since = self.writing_since
        if since is None or now - since < self._stall_after_s:
            return None
        if self.error is None:
            stall = f"a write has not returned for {now - since:.1f} s (a hung disk?)"
            self._stall = LogUnavailableError(f"cannot append to the provenance log: {stall}")
            self._report(self._stall)
        return self.error

    def refusal(
        self, now: float, other: Callable[[], ProvenanceError | None]
    ) -> ProvenanceError | None:
        """What an awaited append is refused with now: a stalled write's error, else
        `other()`'s (the backlog's), as a new exception each time. Raising one instance
        again and again chains each raise's traceback onto it: every refused request's
        frames, with all they hold (its record, its exchange), were kept for as long as
        the fault lasted (2,000 requests refused at the backlog's bound grew a gateway by
        some 12 MB)."""
        error = self.stalled(now) or other()
        return None if error is None else copy.copy(error)

    def _report(self, error: ProvenanceError) -> None:
        if self.error is None and self._events is not None:
            self._events.error("provenance log not writable", detail=str(error))
        self.error = error

    def failed(self, exc: Exception, now: float) -> ProvenanceError:
        """A write failed: the error appenders see; the disk is probed again later."""
        error = (
            exc
            if isinstance(exc, ProvenanceError)
            else LogUnavailableError(f"the provenance log writer failed: {exc!r}")
        )
        self._report(error)
        self.probe_at = now + self._probe_interval_s
        self.writing_since = None
        return error

    def stopped(self, exc: Exception, now: float) -> None:
        """The committer stopped (a bug): reported until restart, since no probe runs."""
        self.failed(LogUnavailableError(f"the provenance log writer stopped: {exc!r}"), now)

    def refused(self, batch: list[Queued], exc: Exception, now: float, *, last_try: bool) -> None:
        """A write of `batch` failed: its appenders get the error, the rest is kept."""
        error = self.failed(exc, now)
        for queued in batch:
            if queued.awaited and not queued.future.done():
                queued.future.set_exception(error)
        unawaited = [queued for queued in batch if not queued.awaited]
        self.keep(unawaited, error, last_try=last_try)

    def keep(self, refused: list[Queued], error: ProvenanceError, *, last_try: bool) -> None:
        """Keep the unawaited records of a failed write; fail (with `error`) the oldest
        beyond the limit, or all of them when that was their `last_try` (closing)."""
        for queued in refused:
            queued.compact()
        self._kept.extend(refused)
        excess = max(0, len(self._kept) if last_try else len(self._kept) - self._limit)
        for queued in self._kept[:excess]:
            if not queued.future.done():
                queued.future.set_exception(error)
        del self._kept[:excess]

    def over(self) -> list[Queued]:
        """A write or probe succeeded: the records kept meanwhile, oldest first, to write."""
        if self.error is not None and self._events is not None:
            self._events.info("provenance log writable again", kept=len(self._kept))
        self.error = self.probe_at = self.writing_since = None
        return self.take()

    def returned(self) -> list[Queued]:
        """A disk operation that writes no records (a snapshot) returned: a stall it was
        reported as is over (the records kept meanwhile, to write); a failed write's
        error stays until a write or probe succeeds."""
        self.writing_since = None
        if self.error is not None and self.error is self._stall:
            return self.over()
        return []

    def withdraw(self, future: asyncio.Future[LogEntry], queue: list[Queued]) -> bool:
        """Take the record of `future` (an unawaited one) out of `queue` or of those kept:
        it will never be written, and its future is cancelled. False when neither holds it
        (a write holds it now, or made it durable, or failed it)."""
        for held in (queue, self._kept):
            for position, queued in enumerate(held):
                if queued.future is future and not queued.awaited:
                    del held[position]
                    future.cancel()
                    return True
        return False

    def take(self) -> list[Queued]:
        """Every record kept (none is kept any more), oldest first."""
        taken, self._kept = self._kept, []
        return taken


class Withdrawing:
    """`ProvenanceLog.withdraw` (a mixin: the log's queue and outage)."""

    _queue: list[Queued]
    _outage: Outage

    def withdraw(self, future: asyncio.Future[LogEntry]) -> bool:
        """Take back a record `append_soon` queued (`future`, the one it returned) that no
        write has made durable or holds now: queued, or kept after a refused write. It is
        never written, and its future is cancelled. False: too late (`Outage.withdraw`).
        A request whose next dispatch record the log refused takes back the completion of
        its failed attempt written before it, to write it with the status its client gets
        (gateway/api/recorder.py)."""
        return self._outage.withdraw(future, self._queue)
