"""The synchronous core of the log writer: durable appends, checkpoints, crash recovery.

An append is durable when `append_frames` returns: its frames are written to the
write-ahead segment in one synchronous write (nothing else happens on that path: no
hashing, no tree, no tiles; the caller brings the leaf hashes and frames).
A checkpoint has two halves so that appends never wait for one:

- `snapshot()`, called between appends, takes the entries appended since the last
  snapshot and rotates the write-ahead segment (the next append starts a new one);
- `export(snapshot)` adds them to the tiled tree, writes the tiles and entry bundles, then
  signs and writes the checkpoint, and deletes the segments it now covers. It may run on
  another thread while appends go on, one export at a time, in snapshot order.

`ProvenanceLog` calls `append_frames` and `snapshot` on its writer thread and `export` on
its checkpoint thread; `checkpoint()` does both at once for single-threaded callers. A
checkpoint never covers entries that are not on disk: it covers exactly a snapshot's.
On open, a torn tail of the last segment is cut, the entries after the last checkpoint are
replayed, and a new checkpoint is signed over them. With a high-water file (`HighWater`,
outside the directory), a directory that holds less than the log already signed under its
origin is refused rather than opened as a shorter log, and each checkpoint is recorded
there once it is durable.

The directory must stay the one that was opened: once it was deleted or replaced (the
segment in use is gone from it, or a new segment or a checkpoint would go to another
directory of the same name), nothing more is written, acknowledged or signed; a restart
recovers from whatever directory is there then.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.provenance.errors import LogCorruptedError, LogUnavailableError, ProvenanceError
from gateway.provenance.files import make_directories, write_files_atomically
from gateway.provenance.formats.checkpoint import Checkpoint, sign_checkpoint
from gateway.provenance.formats.layout import CHECKPOINT, WAL, history_path, list_history
from gateway.provenance.formats.merkle import HASH_SIZE, inclusion_proof
from gateway.provenance.formats.note import Signer, Verifier
from gateway.provenance.formats.tiles import TileReader
from gateway.provenance.formats.tree import TiledTree
from gateway.provenance.formats.wal import segment_path
from gateway.provenance.writer.high_water import HighWater
from gateway.provenance.writer.log_directory import LogDirectory, unavailable
from gateway.provenance.writer.recovery import (
    check_no_later_tree,
    check_signed,
    holds_note,
    note_text,
    read_note,
    replay_segments,
)
from gateway.provenance.writer.segment_writer import SegmentWriter
from gateway.provenance.writer.tree_check import rebuild_tree

__all__ = ["LogStore", "Recovery", "SignedNote", "Snapshot"]


@dataclass(frozen=True, slots=True)
class SignedNote:
    """A checkpoint the log signed, with the exact note bytes it published."""

    checkpoint: Checkpoint
    note: bytes


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Entries made durable since the previous snapshot, as (entry, leaf hash); the log
    holds `size` entries once they are added, and has held `held` bytes of them
    (`LogStore.unsigned_bytes`) since it opened."""

    size: int
    entries: tuple[tuple[bytes, bytes], ...]
    held: int = 0


@dataclass(frozen=True, slots=True)
class Recovery:
    """What `open` found: entries replayed from the segments, torn bytes cut, and the
    damaged or missing tiles it rewrote from the entry bundles."""

    replayed: int
    torn_bytes: int
    rewritten: tuple[str, ...] = ()


class LogStore:
    """One log directory, opened by exactly one writer (an exclusive lock is held)."""

    def __init__(
        self,
        held: LogDirectory,
        origin: str,
        signers: Sequence[Signer],
        high_water: HighWater | None = None,
    ) -> None:
        self.directory = held.path
        self.origin = origin
        self._signers = tuple(signers)
        self._held = held  # locked, and checked to be the directory that was opened
        # The newest checkpoint kept outside the directory, and the size it records now.
        self._high_water = high_water
        self._recorded: int | None = None
        # The writer's side: durable size and what the next snapshot takes.
        self._size = 0
        self._unexported: list[tuple[bytes, bytes]] = []
        self._segment: SegmentWriter | None = None
        # Bytes of entries (and their leaf hashes) appended since open, and how many of
        # them the latest signed checkpoint covers: the rest is held in memory until one
        # does (`_unexported`, a snapshot being exported, `_pending`).
        self._appended_bytes = 0
        self._signed_bytes = 0
        # The exporter's side: the tree and the full tiles/bundles not yet written.
        self._tree = TiledTree()
        self._pending: list[tuple[str, bytes]] = []
        self._latest: SignedNote | None = None
        self._closed = False
        self.recovery = Recovery(0, 0)
        self.batches = 0  # successful write+fsync rounds, for metrics and benchmarks
        # Why the last export could not delete what its checkpoint covers, if it could not.
        self.cleanup_error: ProvenanceError | None = None

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        origin: str,
        signers: Sequence[Signer],
        *,
        high_water: HighWater | None = None,
        retired: Sequence[Verifier] = (),
    ) -> LogStore:
        """Open (creating if needed) and recover a log directory; signs a checkpoint.
        The newest checkpoint must be signed by one of `signers` or `retired` keys. With
        `high_water`, a directory that holds less than (or another tree than) the
        checkpoint it records for this origin is refused (`LogForkError`), and every
        checkpoint signed is recorded there."""
        if not signers:
            raise ValueError("a log needs at least one signer")
        Checkpoint(origin, 0, bytes(32))  # validates the origin line early
        held = LogDirectory.lock(Path(directory).absolute())
        store = cls(held, origin, signers, high_water)
        try:
            store._recover([*(s.verifier() for s in signers), *retired])
            store.checkpoint()
            store._publish_latest()
            store.clean_up([], None)  # every segment is covered now, torn leftovers included
        except (ProvenanceError, OSError):
            store.close()
            raise
        return store

    def _recover(self, verifiers: Sequence[Verifier]) -> None:
        history = list_history(self.directory)
        signed, rewritten = 0, list[str]()
        if history:
            size, path = history[-1]
            checkpoint = Checkpoint.parse(note_text(note := read_note(path), path))
            if checkpoint.origin != self.origin:
                raise LogCorruptedError(
                    f"{self.directory} holds the log {checkpoint.origin!r}, not {self.origin!r}"
                )
            if checkpoint.size != size:
                raise LogCorruptedError(f"{path} holds a checkpoint of size {checkpoint.size}")
            check_signed(note, path, verifiers)
            signed = size
        check_no_later_tree(self.directory, signed, has_history=bool(history))
        if history:
            self._tree, rewritten = rebuild_tree(self.directory, checkpoint)
            self._latest = SignedNote(checkpoint, note)
        if self._high_water is not None:
            newest = self._latest.checkpoint if self._latest is not None else None
            self._recorded = self._high_water.check(self.directory, self.origin, newest)
        pending, replayed, torn = replay_segments(self.directory, self._tree)
        self._pending.extend(pending)
        self._size = self._tree.size
        self.recovery = Recovery(replayed, torn, tuple(rewritten))

    def _publish_latest(self) -> None:
        """Make the checkpoint file the newest signed checkpoint: a crash between writing
        the history file and the checkpoint file left the older one there."""
        latest = self._latest
        if latest is None:
            return
        path = self.directory / CHECKPOINT
        try:
            if holds_note(path, latest.note):
                return
            write_files_atomically([(path, latest.note)], root=self.directory)
        except OSError as exc:
            raise unavailable("write a checkpoint to", exc) from exc

    # --- state ------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Entries made durable (the writer's count; checkpoints may lag behind)."""
        return self._size

    @property
    def latest(self) -> SignedNote | None:
        return self._latest

    @property
    def unsigned_bytes(self) -> int:
        """Bytes of entries (each with its 32-byte leaf hash) made durable that no signed
        checkpoint covers yet: what the log holds in memory until one does. Read from
        any thread (two counters, each written by one thread: a read between them may lag)."""
        return max(0, self._appended_bytes - self._signed_bytes)

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailableError("the provenance log is closed")

    # --- writing ----------------------------------------------------------------------------

    def append_frames(self, pairs: Sequence[tuple[bytes, bytes]], frames: bytes) -> int:
        """Make a batch durable: `pairs` (entry, leaf hash; entries within `MAX_ENTRY_SIZE`),
        `frames` their `encode_frame`s joined; returns the first entry's index. Entries wait
        for the next snapshot as copies of their own size, not orjson's ~4 KiB buffers."""
        self._check_open()
        try:
            self._writable_segment().append(frames)
        except OSError as exc:
            raise unavailable("append to", exc) from exc
        self.batches += 1
        start = self._size
        self._size += len(pairs)
        self._unexported += [(bytes(memoryview(e)), leaf) for e, leaf in pairs]
        self._appended_bytes += sum(len(e) for e, _ in pairs) + HASH_SIZE * len(pairs)
        return start

    def probe(self) -> None:
        """Raise LogUnavailableError if an append would fail now; appends nothing."""
        self._check_open()
        try:
            self._writable_segment().probe()
        except OSError as exc:
            raise unavailable("append to", exc) from exc

    def _writable_segment(self) -> SegmentWriter:
        if self._segment is None:
            self._held.check_same()
            wal = self.directory / WAL
            make_directories(wal, stop=self.directory)
            self._segment = SegmentWriter(segment_path(wal, self.size), valid_bytes=0)
        return self._segment

    def snapshot(self) -> Snapshot:
        """Take the entries appended since the last snapshot and start a new segment for
        the next append, so the export of this snapshot can delete the old ones."""
        self._check_open()
        if self._segment is not None:
            try:
                self._segment.close()
            except OSError as exc:  # nothing taken: the next snapshot takes these entries
                raise unavailable("close a segment of", exc) from exc
            self._segment = None
        taken = Snapshot(self._size, tuple(self._unexported), self._appended_bytes)
        self._unexported = []
        return taken

    def checkpoint(self) -> SignedNote:
        """Sign a checkpoint over every durable entry now (`export(snapshot())`)."""
        return self.export(self.snapshot())

    def export(self, snapshot: Snapshot) -> SignedNote:
        """Add a snapshot's entries to the tree, write tiles and bundles, sign and write a
        checkpoint over them (if the tree grew since the last one), delete the segments it
        covers. Snapshots must be exported in the order they were taken. If writing fails,
        the entries stay in the tree and their files are written by the next export."""
        self._check_open()
        tree = self._tree
        if tree.size + len(snapshot.entries) != snapshot.size:
            raise AssertionError(f"snapshot of size {snapshot.size} after tree {tree.size}")
        for entry, leaf in snapshot.entries:
            self._pending.extend(tree.append(entry, leaf))
        if self._latest is not None and self._latest.checkpoint.size == tree.size:
            self._record(self._latest)  # a recording that failed before, or the first
            self._signed_bytes = snapshot.held
            return self._latest
        completed = [name for name, _ in self._pending]
        files = [(self.directory / name, data) for name, data in self._pending]
        files += [(self.directory / name, data) for name, data in self._tree.partial_files()]
        checkpoint = Checkpoint(self.origin, tree.size, tree.root())
        note = sign_checkpoint(checkpoint, self._signers)
        try:
            self._held.check_same()
            write_files_atomically(files, root=self.directory)
            self._pending = []
            history = history_path(self.directory, checkpoint.size)
            write_files_atomically([(history, note)], root=self.directory)
            write_files_atomically([(self.directory / CHECKPOINT, note)], root=self.directory)
        except OSError as exc:
            raise unavailable("write a checkpoint to", exc) from exc
        signed = SignedNote(checkpoint, note)
        # Not the latest until recorded: a failed recording is retried by the next export,
        # which then signs the same checkpoint again (the same note: Ed25519 is deterministic).
        self._record(signed)
        self._latest = signed
        self._signed_bytes = snapshot.held
        try:
            self.clean_up(completed, checkpoint.size)
        except ProvenanceError as exc:
            # The checkpoint is durable and the log writable: what is left over is skipped
            # on recovery and deleted by the next export. Reported, not a failure.
            self.cleanup_error = exc
        else:
            self.cleanup_error = None
        return self._latest

    def _record(self, signed: SignedNote) -> None:
        """Record `signed` in the high-water file, unless it records that size already."""
        if self._high_water is None or self._recorded == signed.checkpoint.size:
            return
        try:
            self._high_water.write(signed.note)
        except OSError as exc:
            raise unavailable("record the signed checkpoint of", exc) from exc
        self._recorded = signed.checkpoint.size

    def clean_up(self, completed: list[str], covered: int | None) -> None:
        """Drop the segments a checkpoint of size `covered` covers (None: all of them, on
        open) and partial tiles now superseded by full ones (`LogDirectory.remove_covered`)."""
        self._held.remove_covered(completed, covered)

    # --- reading ----------------------------------------------------------------------------

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """Audit path of entry `index` in the checkpointed tree of `size` (default latest)."""
        latest = self._latest.checkpoint.size if self._latest else 0
        size = latest if size is None else size
        if size > latest:
            raise ValueError(f"no checkpoint covers size {size} yet (latest is {latest})")
        reader = TileReader(self.directory, size)
        return inclusion_proof(index, size, reader.node)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._segment is not None:
            self._segment.close(cut=False)  # the last segment: recovery cuts a torn tail
            self._segment = None
        self._held.release()
