"""The newest checkpoint a log signed, kept outside its directory: the high-water file.

A log directory that was emptied, deleted, or swapped for an older copy or for another
log would otherwise open as a fresh (or shorter) log under the same origin and key, and
its next checkpoint would fork the log: two trees under one origin, and an auditor who
holds a checkpoint of the first could never be shown consistency with the second. The
directory cannot tell this itself (the files that would tell are the ones gone), so
`LogStore` keeps a copy of each checkpoint it signs in a file elsewhere, written
atomically after the checkpoint's own files (one small write per checkpoint, never per
append; a crash in between leaves the file behind the log, never ahead of it).

On open (`HighWater.check`), before anything is signed, the log must reach the size the
file records and hold the same tree there (the root at that size, recomputed from the
tiles). Otherwise `LogForkError`, naming the directory, the origin, the recorded size and
the ways on: restore the directory, or start a new log under a new origin, which the
operator says explicitly (`new_origin`, `owngate serve --new-log-origin`). A missing file
is a fresh install, or a log from before this file existed: the log opens, and the file
is written with its first checkpoint.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gateway.provenance.errors import LogCorruptedError, LogForkError, MalformedError
from gateway.provenance.files import write_files_atomically
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.merkle import range_hash
from gateway.provenance.formats.tiles import TileReader
from gateway.provenance.writer.recovery import note_text

__all__ = ["NEW_ORIGIN_HINT", "HighWater"]

# A checkpoint note is a few hundred bytes (more with cosignatures); anything this large
# named by mistake is not one, and is not read whole.
_MAX_NOTE = 64 * 1024

# How the gateway's operator starts a new log (docs/provenance.md, "Starting over").
NEW_ORIGIN_HINT = (
    "set provenance.origin to a new origin and start once with --new-log-origin "
    "(env OWNGATE_NEW_LOG_ORIGIN=1)"
)


@dataclass(frozen=True, slots=True)
class HighWater:
    """Where the newest signed checkpoint is kept (`path`, outside the log directory), and
    whether the operator asked to start a new log under a new origin (`new_origin`: a file
    recording another origin is then replaced, never a file recording this one)."""

    path: Path
    new_origin: bool = False

    def read(self) -> Checkpoint | None:
        """The checkpoint the file records; None when there is no file."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LogCorruptedError(f"cannot read {self.path}: {exc.strerror}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LogCorruptedError(f"{self.path} is not a regular file")
            data = os.read(fd, _MAX_NOTE + 1)
        finally:
            os.close(fd)
        if len(data) > _MAX_NOTE:
            raise LogCorruptedError(f"{self.path} is larger than a checkpoint")
        try:
            return Checkpoint.parse(note_text(data, self.path))
        except MalformedError as exc:
            raise LogCorruptedError(f"{self.path} does not hold a checkpoint: {exc}") from exc

    def check(self, directory: Path, origin: str, signed: Checkpoint | None) -> int | None:
        """Refuse (`LogForkError`) to go on from `signed` (the directory's newest signed
        checkpoint, None for no log) unless it extends the checkpoint the file records for
        `origin`. Returns the recorded size when the file is this log's, else None."""
        recorded = self.read()
        if recorded is None:
            return None
        if recorded.origin != origin:
            if self.new_origin:
                return None  # the new log's first checkpoint replaces the file
            raise LogForkError(
                f"{self.path} records the log {recorded.origin!r} (signed up to size "
                f"{recorded.size}), not {origin!r}: provenance.origin changed, or two logs "
                f"share this file. To start a new log under {origin!r}, start once with "
                "--new-log-origin (env OWNGATE_NEW_LOG_ORIGIN=1); to go on with "
                f"{recorded.origin!r}, set provenance.origin back to it; give each replica "
                "its own provenance.high_water_file"
            )
        size = 0 if signed is None else signed.size
        if size < recorded.size:
            holds = "no log" if signed is None else f"a log signed only up to size {size}"
            raise LogForkError(
                f"{directory} holds {holds}, but the log {origin!r} already signed a "
                f"checkpoint of size {recorded.size} (recorded in {self.path}): going on "
                "would fork it (a second tree under the same origin and key). Restore the "
                f"log directory from a backup that reaches size {recorded.size}; or, to "
                f"leave that log behind, {NEW_ORIGIN_HINT}"
            )
        if (
            signed is not None
            and recorded.size
            and _root(directory, signed, recorded.size) != (recorded.root)
        ):
            raise LogForkError(
                f"{directory} holds another tree than the log {origin!r} signed: its tree "
                f"at size {recorded.size} is not the one recorded in {self.path}, so this "
                "directory is another log under the same origin (a fork). Restore the log "
                f"that signed it; or, to leave that log behind, {NEW_ORIGIN_HINT}"
            )
        return recorded.size

    def write(self, note: bytes) -> None:
        """Record `note` (a checkpoint just made durable in the log) atomically; raises
        OSError."""
        write_files_atomically([(self.path, note)], root=Path(self.path.anchor))


def _root(directory: Path, signed: Checkpoint, size: int) -> bytes:
    """The root of the log's tree at `size` (at most `signed.size`), from its tiles."""
    if size == signed.size:
        return signed.root
    try:
        return range_hash(0, size, TileReader(directory, signed.size).node)
    except (MalformedError, OSError) as exc:
        raise LogCorruptedError(f"cannot rebuild the tree at size {size}: {exc}") from exc
