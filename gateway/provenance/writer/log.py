"""`ProvenanceLog`: the asyncio writer the gateway calls, with group commit and checkpoints.

`await log.append(record)` returns once the record is durable. Appends within the
group-commit window share one synchronous write (an `O_DSYNC` segment) on the log's writer
thread, so the loop never blocks on disk; records nobody waits on (`append_soon`) go with
the next such batch. A checkpoint is signed every `checkpoint_every` entries or
`checkpoint_interval_ms`: the writer thread takes a snapshot between two batches
(`LogStore.snapshot`, which also rotates the write-ahead segment) and the checkpoint thread
builds the tiles, signs and writes it (`LogStore.export`) while appends go on: exactly the
entries durable at the snapshot.

`append_sealed(record, seal)` (or `queue_sealed`, with no coroutine) returns once the entry
is durable, with a future for `seal(entry)`, run on the loop once per batch right after its
appenders were woken (receipts); with a `batch_seal`, one signature covers a batch's
receipts (`Sealer`). If the disk refuses a write, `append` raises `LogUnavailableError` (the
gateway answers 503), nothing of that batch logged; the next append, or a probe each
`probe_interval_ms`, tries again; records nobody waits on are kept meanwhile (`Outage`;
`Checkpointer` for checkpoints, and the bound on the entries they have yet to sign).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence

from gateway.provenance.errors import LogUnavailableError, ProvenanceError
from gateway.provenance.formats.note import Signer, Verifier
from gateway.provenance.formats.proofs import TlogProof
from gateway.provenance.formats.records import LogEntry
from gateway.provenance.writer.checkpointer import Checkpointer, LogSettings
from gateway.provenance.writer.events import FaultEvents, Reported
from gateway.provenance.writer.high_water import HighWater
from gateway.provenance.writer.outage import Outage, Withdrawing
from gateway.provenance.writer.queued import Landing, Queued, entry_of, landed
from gateway.provenance.writer.sealer import BatchSeal, Seal, Sealer
from gateway.provenance.writer.signal import Signal
from gateway.provenance.writer.store import LogStore, Recovery, SignedNote
from gateway.provenance.writer.worker import LoopWorker

__all__ = ["LogSettings", "ProvenanceLog"]


class ProvenanceLog(Withdrawing):
    """The per-replica provenance log. Create with `await ProvenanceLog.open(...)`."""

    def __init__(
        self,
        store: LogStore,
        worker: LoopWorker,
        settings: LogSettings,
        clock: Callable[[], float],
        batch_seal: BatchSeal | None = None,
        events: FaultEvents | None = None,
    ) -> None:
        self._store = store
        self._worker = worker  # the writer thread: appends and snapshots
        self._loop = asyncio.get_running_loop()
        self._sealer = Sealer(batch_seal)
        self._settings = settings
        self._queue: list[Queued] = []
        self._wakeup = Signal(self._loop)  # the queue went from empty to not empty
        self._filled = Signal(self._loop)  # the queue reached the size of the last batch
        self._last_batch = 1  # awaited appends in the last batch
        self._write_time = 0.0  # a write's (moving average, s): the longest a batch waits
        self._waiters = 0  # awaited appends queued now
        self._deferred_until: float | None = None  # when unawaited queued records must go
        self._deferred_timer: asyncio.TimerHandle | None = None  # then (unless they went)
        self._closing = self._aborting = False
        self._stopping: asyncio.Task[None] | None = None  # close() or abort(), once
        self._size = store.size
        events = None if events is None else Reported(events)  # a line never stops the writer
        self._checkpoints = Checkpointer(store, settings, clock, self._wakeup.set, events)
        self._outage = Outage(settings, events)
        self._task = self._loop.create_task(self._run(), name="provenance-log")

    @classmethod
    async def open(
        cls,
        directory: str | os.PathLike[str],
        origin: str,
        signer: Signer,
        *,
        cosigners: Sequence[Signer] = (),
        settings: LogSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        batch_seal: BatchSeal | None = None,
        events: FaultEvents | None = None,
        high_water: HighWater | None = None,
        retired: Sequence[Verifier] = (),
    ) -> ProvenanceLog:
        """Open or create the log in `directory`, recovering after a crash; `cosigners` also
        sign every checkpoint (e.g. the previous key during a rotation); `events` hears of
        each fault when it begins and ends; `high_water` refuses a directory holding less
        than the log signed, `retired` keys may have signed its newest checkpoint."""
        worker = LoopWorker(asyncio.get_running_loop(), "provenance-log")
        signers, water = [signer, *cosigners], high_water
        try:
            store = await worker.run(
                lambda: LogStore.open(directory, origin, signers, high_water=water, retired=retired)
            )
        except BaseException:
            worker.shutdown(wait=False)
            raise
        return cls(store, worker, settings or LogSettings(), clock, batch_seal, events)

    @property
    def origin(self) -> str:
        return self._store.origin

    @property
    def size(self) -> int:
        """Entries made durable so far."""
        return self._size

    @property
    def recovery(self) -> Recovery:
        return self._store.recovery

    @property
    def last_error(self) -> ProvenanceError | None:
        """The last write or checkpoint failure, stall or full backlog, until its kind recovers."""
        return self._outage.current(self._loop.time()) or self._checkpoints.current()

    @property
    def unsigned_bytes(self) -> tuple[int, int]:  # held in memory until signed, and the bound
        return self._store.unsigned_bytes, self._checkpoints.backlog.limit

    @property
    def export_seconds(self) -> float:
        """How long the checkpoint export in progress has run (0 when none runs)."""
        return self._checkpoints.running_for()

    @property
    def cleanup_error(self) -> ProvenanceError | None:
        """Why the last checkpoint could not delete what it covers (the next one will)."""
        return self._store.cleanup_error

    @property
    def batches(self) -> int:
        """Write+fsync rounds so far; appends / batches is the group-commit factor."""
        return self._store.batches

    @property
    def last_batch(self) -> int:
        """Awaited appends in the last committed batch (the next batch waits for as many)."""
        return self._last_batch

    @property
    def write_seconds(self) -> float:
        """How long a batch's write and fsync takes (a moving average; 0 before the first)."""
        return self._write_time

    @property
    def store(self) -> LogStore:
        """The files the log writes (snapshots, exports, clean-up), for tools and tests."""
        return self._store

    def latest_checkpoint(self) -> SignedNote | None:
        return self._store.latest

    async def exports_idle(self) -> None:
        await self._checkpoints.idle()  # no export runs now (one that fell due may start)

    async def append(self, record: Mapping[str, object], *, checked: bool = False) -> LogEntry:
        """Validate, encode and durably append one record; returns its index and leaf hash.
        `checked=True` skips the schema walk (a `records` builder's record is valid). Raises
        RecordError, or LogUnavailableError when the log cannot be written (nothing logged)."""
        return await self._put(record, checked, awaited=True)

    def append_soon(
        self, record: Mapping[str, object], *, checked: bool = False, encoded: bytes = b""
    ) -> asyncio.Future[LogEntry]:
        """Queue a record nothing waits on (e.g. a completion): the future completes when it
        is durable (or fails). Raises at once what `append` raises before queueing. `encoded`:
        the record's `canonical_json_of_plain`, made by the caller, logged as given."""
        return self._put(record, checked, awaited=False, encoded=encoded)

    async def append_sealed(
        self, record: Mapping[str, object], seal: Seal, *, checked: bool = False
    ) -> tuple[LogEntry, asyncio.Future[bytes]]:
        """`append`, with a future for `seal(entry)` (e.g. a receipt naming the entry), run on
        the event loop once the entry is durable. If `seal` raises, the record is still
        durable and the future holds the error; if the append fails, so does the future."""
        sealed: asyncio.Future[bytes] = self._loop.create_future()
        try:
            entry = await self._put(record, checked, awaited=True, seal=seal, sealed=sealed)
        except Exception as exc:
            if not sealed.done():
                sealed.set_exception(exc)
                sealed.exception()  # retrieved: the caller gets the error from the append
            raise
        except BaseException:
            sealed.cancel()
            raise
        return entry, sealed

    def queue_sealed(
        self, record: Mapping[str, object], seal: Seal, *, checked: bool = False
    ) -> tuple[Landing, asyncio.Future[bytes]]:
        """`append_sealed`, queued now: the entry's future (a `Landing`) and the seal's."""
        sealed: asyncio.Future[bytes] = self._loop.create_future()
        landing = Landing(loop=self._loop)
        self._put(record, checked, awaited=True, seal=seal, sealed=sealed, future=landing)
        return landing, sealed

    def _put(
        self,
        record: Mapping[str, object],
        checked: bool,
        *,
        awaited: bool,
        seal: Seal | None = None,
        sealed: asyncio.Future[bytes] | None = None,
        encoded: bytes = b"",
        future: asyncio.Future[LogEntry] | None = None,
    ) -> asyncio.Future[LogEntry]:
        if self._closing or self._task.done():
            raise LogUnavailableError("the provenance log is closed")
        backlog = self._checkpoints.backlog  # at its bound, or a stalled write: fail fast
        if awaited and (refused := self._outage.refusal(self._loop.time(), backlog.current)):
            raise refused  # a completion (not awaited) still queues behind it
        entry = entry_of(record, checked, encoded)
        future = self._loop.create_future() if future is None else future
        self._queue.append(Queued(entry, future, awaited, seal, sealed))
        if awaited:
            self._waiters += 1
            self._wakeup.set()
            if self._waiters >= self._last_batch:
                self._filled.set()
        elif self._deferred_until is None:
            deadline = self._loop.time() + self._settings.deferred_flush_ms / 1000
            self._deferred_until = deadline
            # the committer's sleep must now end by that deadline
            self._deferred_timer = self._loop.call_at(deadline, self._wakeup.set)
        elif len(self._queue) >= self._settings.max_batch:
            self._wakeup.set()
        return future

    async def checkpoint(self) -> SignedNote:
        """Sign a checkpoint now over all durable entries (the latest if none is new)."""
        snapshot = await self._worker.run(self._store.snapshot)
        return await self._checkpoints.now(snapshot)

    async def inclusion_proof(self, index: int) -> TlogProof:
        """A C2SP tlog-proof for entry `index`: see `Checkpointer.inclusion_proof`."""
        return await self._checkpoints.inclusion_proof(index)

    async def consistency_proof(self, old: int, new: int) -> list[bytes]:
        """RFC 6962 consistency proof between signed sizes: `Checkpointer.consistency_proof`."""
        return await self._checkpoints.consistency_proof(old, new)

    async def close(self) -> None:
        """Flush queued appends, sign a final checkpoint, release the directory."""
        await self._stop(aborting=False)

    async def abort(self) -> None:
        """Stop without a final checkpoint, releasing the directory: a batch being written
        completes, queued appends fail; what is durable is recovered by the next `open`."""
        await self._stop(aborting=True)

    async def _stop(self, *, aborting: bool) -> None:
        # One stop, in its own task: a cancelled caller cuts nothing short; later calls wait.
        if self._stopping is None:
            self._closing, self._aborting = True, aborting
            self._requeue(self._outage.take())  # closing: their last try, first
            self._wakeup.set()
            self._stopping = self._loop.create_task(self._stopped(), name="provenance-stop")
        await asyncio.shield(self._stopping)

    async def _stopped(self) -> None:
        try:
            await self._task
            if not self._aborting:
                await self.checkpoint()  # a failure (full disk) is raised, once released
        finally:
            await self._checkpoints.idle()
            await self._worker.run(self._store.close)
            self._checkpoints.shutdown()
            self._worker.shutdown(wait=True)

    def _fail_queue(self, error: LogUnavailableError) -> None:
        for queued in [*self._outage.take(), *self._queue]:
            if not queued.future.done():
                queued.future.set_exception(error)
        self._queue.clear()
        self._waiters = 0

    def _requeue(self, kept: list[Queued]) -> None:
        """Records a failed write refused go first in the queue, due now."""
        if kept:
            self._queue[:0] = kept
            self._deferred_until = self._loop.time()
            self._wakeup.set()

    async def _run(self) -> None:
        try:
            await self._rounds()
        except Exception as exc:  # noqa: BLE001 - a bug: reported until restart, not lost
            self._outage.stopped(exc, self._loop.time())
        finally:  # however the committer ends, no append is left waiting
            self._fail_queue(LogUnavailableError("the provenance log writer has stopped"))

    async def _rounds(self) -> None:
        # Runs until close(); each round either commits a batch, signs, or waits for work.
        while not self._aborting:
            timeout = self._idle_timeout()
            if timeout is None or timeout > 0:
                await self._wakeup.wait(timeout)
                self._wakeup.clear()
                timeout = self._idle_timeout()
                if timeout is None or timeout > 0:
                    continue  # woken to plan again (a new deadline): nothing is due yet
            probe_at = self._outage.probe_at
            if probe_at is not None and self._loop.time() >= probe_at:
                await self._probe()
            await self._gather_batch()
            if self._aborting:
                return
            batch = self._queue[: self._settings.max_batch]
            del self._queue[: self._settings.max_batch]
            if not self._queue:
                self._deferred_until = None
                if self._deferred_timer is not None:
                    self._deferred_timer.cancel()
                    self._deferred_timer = None
            if batch:
                await self._commit(batch)
            if self._checkpoints.due(self._size) and not self._aborting:
                self._outage.writing_since = self._loop.time()  # it may hang like a write
                try:  # the snapshot is taken here, between two batches
                    snapshot = await self._worker.run(self._store.snapshot)
                except Exception as exc:  # noqa: BLE001 - the committer outlives any snapshot
                    self._outage.failed(exc, self._loop.time())
                else:
                    self._requeue(self._outage.returned())
                    self._checkpoints.start(snapshot)
            if self._closing and not self._queue:
                return

    def _idle_timeout(self) -> float | None:
        """How long the committer may sleep now: 0 when something is due, None until woken.
        Records nobody waits on ride with the next awaited batch, or go after
        `deferred_flush_ms` at the latest."""
        if self._waiters or self._closing or len(self._queue) >= self._settings.max_batch:
            return 0.0
        timeout = self._checkpoints.idle_timeout(self._size)
        for deadline in (self._deferred_until, self._outage.probe_at):
            if deadline is not None:
                left = max(0.0, deadline - self._loop.time())
                timeout = left if timeout is None else min(timeout, left)
        return timeout

    async def _probe(self) -> None:
        self._outage.writing_since = self._loop.time()
        try:
            await self._worker.run(self._store.probe)
        except Exception as exc:  # noqa: BLE001 - the committer must outlive any probe
            self._outage.failed(exc, self._loop.time())
        else:
            self._requeue(self._outage.over())

    async def _gather_batch(self) -> None:
        """Wait for as many awaited appends as the last batch held, up to the group-commit
        window or the time a write takes, whichever is shorter (`append_soon` records ride
        along, neither starting nor prolonging it). A lone appender is committed at once;
        concurrent ones fill the batch well within the window; later ones join the next."""
        window = min(self._settings.group_commit_ms / 1000.0, self._write_time)
        target = min(self._last_batch, self._settings.max_batch)
        if window <= 0 or self._closing or not 0 < self._waiters < target:
            return
        self._filled.clear()
        await self._filled.wait(window)

    async def _commit(self, batch: list[Queued]) -> None:
        pairs = [(queued.entry, queued.leaf) for queued in batch]
        frames = b"".join([queued.frame for queued in batch])
        awaited = sum(1 for queued in batch if queued.awaited)
        self._waiters -= awaited
        self._last_batch = max(1, awaited)
        began, size = time.perf_counter(), self._size
        self._outage.writing_since = self._loop.time()  # `over` or `failed` ends it

        def written(start: int) -> None:  # `then`: the appenders wake a loop turn sooner
            self._size += len(batch)
            took = time.perf_counter() - began
            self._write_time = took if not self._write_time else (7 * self._write_time + took) / 8
            self._requeue(self._outage.over())
            if seals := landed(batch, start):  # after the appenders' wake-ups: they go first
                self._loop.call_soon(self._sealer.seal, start, seals)

        try:  # one synchronous write on the writer thread makes the batch durable
            await self._worker.run(self._store.append_frames, pairs, frames, then=written)
        except Exception as exc:  # every waiter gets the error, none hangs
            if self._size != size:
                raise  # a bug once the batch was durable (`written` ran), not a refused write
            self._outage.refused(batch, exc, self._loop.time(), last_try=self._closing)
