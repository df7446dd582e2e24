"""When a checkpoint is due, and the thread that builds and signs it beside the appends.

`ProvenanceLog` takes a `Snapshot` on its writer thread between two batches and hands it
to `Checkpointer.start`, which exports it (`LogStore.export`: tiles, bundles, signature,
files, segment clean-up) on the checkpoint thread while the writer goes on appending. One
export runs at a time, in snapshot order; reads of the stored tiles (proofs) run on the
same thread, so they never see a checkpoint half written. A failing export is reported
once (`FaultEvents`), and so is the next one that signs again. So is an export that has
not returned for `export_stall_after_ms` (a hung disk): it is the log's error (readiness)
until it returns, and `running_for` says how long the export in progress has run. An
export writes a tile per 256 entries and more (a checkpoint of 10,000 entries on a slow
network disk can take seconds), so its limit is its own, longer than a write batch's.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gateway.provenance.errors import LogUnavailableError, ProvenanceError
from gateway.provenance.formats.merkle import consistency_proof
from gateway.provenance.formats.proofs import TlogProof
from gateway.provenance.formats.tiles import TileReader
from gateway.provenance.writer.backlog import Backlog
from gateway.provenance.writer.events import FaultEvents
from gateway.provenance.writer.worker import LoopWorker

if TYPE_CHECKING:
    from gateway.provenance.writer.store import LogStore, SignedNote, Snapshot

__all__ = ["Checkpointer", "LogSettings"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Group commit and checkpoint cadence (see docs/provenance.md)."""

    group_commit_ms: float = 2.0
    max_batch: int = 1024
    # Records nobody waits on (completions) go with the next awaited batch or after this.
    deferred_flush_ms: float = 50.0
    checkpoint_every: int = 10_000
    checkpoint_interval_ms: float = 1000.0
    # After a failed write, how often the disk is tried again while no append comes.
    probe_interval_ms: float = 1000.0
    # A write (or probe) that has not returned for this long is a stalled disk: the log
    # says it is not writable and refuses new awaited appends until the write returns.
    stall_after_ms: float = 5000.0
    # A checkpoint export (tiles, bundles, signature) that has not returned for this long
    # is a hung disk: the log is not ready until it returns. Longer than `stall_after_ms`:
    # a slow but live export of many entries must not take the replica out of service.
    export_stall_after_ms: float = 60_000.0
    # Records nobody waits on (completions) that a failed write refused, kept to write
    # once the disk takes writes again; the oldest beyond this many are dropped.
    max_retained: int = 4096
    # Bytes of durable entries (with their leaf hashes) no signed checkpoint covers yet,
    # which the log holds in memory until one does: past this, awaited appends are
    # refused (`Backlog`), so a failing or hung export cannot grow it without bound.
    max_unsigned_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        timings = (
            self.group_commit_ms,
            self.deferred_flush_ms,
            self.checkpoint_interval_ms,
            self.probe_interval_ms,
            self.stall_after_ms,
            self.export_stall_after_ms,
        )
        if not all(math.isfinite(ms) for ms in timings):  # NaN passes every check below
            raise ValueError("the log's timings must be finite numbers of milliseconds")
        if self.group_commit_ms < 0 or self.deferred_flush_ms < 0:
            raise ValueError("group_commit_ms and deferred_flush_ms must be >= 0")
        if (
            min(
                self.checkpoint_interval_ms,
                self.probe_interval_ms,
                self.stall_after_ms,
                self.export_stall_after_ms,
            )
            <= 0
        ):
            raise ValueError(
                "checkpoint_interval_ms, probe_interval_ms, stall_after_ms and "
                "export_stall_after_ms must be > 0"
            )
        if self.max_batch < 1 or self.checkpoint_every < 1:
            raise ValueError("max_batch and checkpoint_every must be >= 1")
        if self.max_retained < 0:
            raise ValueError("max_retained must be >= 0")
        if self.max_unsigned_bytes < 1:
            raise ValueError("max_unsigned_bytes must be >= 1")


class Checkpointer:
    """Checkpoint cadence (every N entries or T ms) and the export thread of one log."""

    def __init__(
        self,
        store: LogStore,
        settings: LogSettings,
        clock: Callable[[], float],
        wake: Callable[[], None],
        events: FaultEvents | None = None,
    ) -> None:
        self._store = store
        self._events = events
        self._settings = settings
        self._clock = clock
        self._wake = wake  # called when an export ends, so the committer re-evaluates
        self._loop = asyncio.get_running_loop()
        self._worker = LoopWorker(self._loop, "provenance-checkpoint")
        self._covered = store.size  # entries a finished or running export covers
        self._running: asyncio.Task[None] | None = None
        self._at = clock()  # when the last export started or ended
        self._started: float | None = None  # when the export in progress started
        self.error: ProvenanceError | None = None  # the last export's failure, if it failed
        # the entries no checkpoint covers yet, held in memory until one does: bounded
        self.backlog = Backlog(settings.max_unsigned_bytes, lambda: store.unsigned_bytes, events)

    def due(self, size: int) -> bool:
        """Is a checkpoint due now, with `size` entries durable?"""
        unsigned = size - self._covered
        if unsigned <= 0 or self._running is not None:
            return False
        if unsigned >= self._settings.checkpoint_every:
            return True
        return (self._clock() - self._at) * 1000.0 >= self._settings.checkpoint_interval_ms

    def idle_timeout(self, size: int) -> float | None:
        """How long the committer may sleep before a checkpoint falls due (None: until
        woken, because nothing is unsigned or an export's end will wake it)."""
        if size == self._covered or self._running is not None:
            return None
        elapsed_ms = (self._clock() - self._at) * 1000.0
        return max(0.0, self._settings.checkpoint_interval_ms - elapsed_ms) / 1000.0

    def start(self, snapshot: Snapshot) -> None:
        """Export `snapshot` in the background (the caller took it on the writer thread)."""
        self._covered = snapshot.size
        self._at = self._started = self._clock()
        self._running = self._loop.create_task(self._export(snapshot), name="provenance-export")

    async def now(self, snapshot: Snapshot) -> SignedNote:
        """Export `snapshot` and return the checkpoint; raises what the export raises."""
        await self.idle()
        self._covered = snapshot.size
        self._started = self._clock()
        try:
            return await self.run(self._store.export, snapshot)
        except Exception as exc:
            self._covered = self._signed()  # the next due export covers these entries
            # whatever failed (the signer too), the caller gets the log's error: a final
            # checkpoint that was not signed is reported as one (`owngate serve` exits 4)
            failure = _log_error(exc)
            if failure is exc:
                raise
            raise failure from exc
        finally:
            self._started = None

    def running_for(self) -> float:
        """Seconds the export in progress has run (0 when none runs)."""
        started = self._started
        return 0.0 if started is None else max(0.0, self._clock() - started)

    def current(self) -> ProvenanceError | None:
        """The checkpoints' error now: the last export's failure, or that of an export
        that has not returned for `export_stall_after_ms` (reported once, like a failure,
        and cleared when an export signs again), or the backlog's bound reached."""
        behind = self.backlog.current()
        seconds = self.running_for()
        if self.error is None and seconds * 1000.0 >= self._settings.export_stall_after_ms:
            stall = f"a checkpoint export has not returned for {seconds:.1f} s (a hung disk?)"
            self.error = LogUnavailableError(f"cannot sign a checkpoint of the log: {stall}")
            if self._events is not None:
                self._events.error("provenance checkpoint not signed", detail=str(self.error))
        return self.error or behind

    async def idle(self) -> None:
        """Wait until no export runs (its outcome is in `error`)."""
        if self._running is not None:
            await asyncio.shield(self._running)

    async def run(self, function: Callable[..., _T], *args: object) -> _T:
        """Run `function` on the checkpoint thread (e.g. read the stored tiles)."""
        return await self._worker.run(function, *args)

    async def inclusion_proof(self, index: int) -> TlogProof:
        """A C2SP tlog-proof for entry `index` against the latest checkpoint, read from the
        stored tiles on this thread. Raises ValueError when no checkpoint covers the entry."""
        latest = self._store.latest
        if latest is None or index >= latest.checkpoint.size:
            raise ValueError(f"entry {index} is not covered by a checkpoint yet")
        size = latest.checkpoint.size
        hashes = await self.run(self._store.inclusion_proof, index, size)
        return TlogProof(index=index, hashes=tuple(hashes), checkpoint=latest.note, extra=None)

    async def consistency_proof(self, old: int, new: int) -> list[bytes]:
        """The RFC 6962 consistency proof from the tree of `old` entries to that of `new`.

        Both trees must be signed (`0 < old <= new <=` the latest checkpoint's size), else
        ValueError. Read from the stored tiles on this thread, so it never races a
        checkpoint that is rewriting them.
        """
        signed = self._signed()
        if not 0 < old <= new <= signed:
            raise ValueError(
                f"no consistency proof from size {old} to {new} (latest checkpoint: {signed})"
            )
        directory = self._store.directory

        def prove() -> list[bytes]:
            return consistency_proof(old, new, TileReader(directory, new).node)

        return await self.run(prove)

    def _signed(self) -> int:
        latest = self._store.latest
        return latest.checkpoint.size if latest else 0

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True)

    async def _export(self, snapshot: Snapshot) -> None:
        try:
            signed = await self.run(self._store.export, snapshot)
        except Exception as exc:  # noqa: BLE001 - kept for readiness, never lost in a task
            # Appends go on; the next export (after one interval) covers these entries too.
            failure = _log_error(exc)
            if self.error is None and self._events is not None:
                self._events.error("provenance checkpoint not signed", detail=str(failure))
            self.error = failure
            self._covered = self._signed()
        else:
            if self.error is not None and self._events is not None:
                self._events.info(
                    "provenance checkpoints signed again", size=signed.checkpoint.size
                )
            self.error = None
        finally:
            self._running = self._started = None
            self._at = self._clock()
            self._wake()


def _log_error(exc: Exception) -> ProvenanceError:
    """The log's error for a failed export: a signer's or a bug's exception wrapped."""
    if isinstance(exc, ProvenanceError):
        return exc
    return LogUnavailableError(f"the checkpoint failed: {exc!r}")
