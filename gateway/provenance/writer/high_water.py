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

A log left behind that way is not forgotten: the file keeps, after the current log's
checkpoint, the last checkpoint of each log it recorded before (retired), and a retired
origin is held to its checkpoint as the current one is: going back to it with
`new_origin` needs its directory, not an empty one (which would be a second tree of it).
The format: signed notes, the current log's first, separated by a blank line (a note
holds exactly one: between its text and its signatures), so a file of one note, as
written before retired logs were kept, reads the same.

The file is bounded (`MAX_FILE`, 1 MiB): each log left behind adds its last checkpoint,
a few hundred bytes, so it holds about 2,000 of them. Past `MAX_RETIRING` (768 KiB, the
rest is room for the current log's checkpoint to grow with cosignatures) no further log
is left behind: `new_origin` is refused with `HighWaterFullError` before anything is
signed, as is a file past `MAX_FILE` when it is read, each saying what to do.

The path is resolved (symbolic links followed) before each write, as it is when read: a
high-water file that is a link to another volume stays one, and its target is replaced.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gateway.confined_reads import check_opened
from gateway.provenance.errors import (
    HighWaterFullError,
    LogCorruptedError,
    LogForkError,
    MalformedError,
)
from gateway.provenance.files import write_files_atomically
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.merkle import range_hash
from gateway.provenance.formats.tiles import TileReader

__all__ = ["MAX_FILE", "MAX_RETIRING", "NEW_ORIGIN_HINT", "HighWater"]

# A checkpoint note is a few hundred bytes (more with cosignatures), and the file holds
# one per log it recorded (current and retired); anything this large named by mistake is
# not one, and is not read whole.
MAX_FILE = 1024 * 1024
# A file this large leaves no further log behind: the rest is room for the current log's
# note, which grows with its cosignatures.
MAX_RETIRING = 768 * 1024

# How the gateway's operator starts a new log (docs/provenance.md, "Starting over").
NEW_ORIGIN_HINT = (
    "set provenance.origin to a new origin and start once with --new-log-origin "
    "(env OWNGATE_NEW_LOG_ORIGIN=1)"
)


class HighWater:
    """Where the newest signed checkpoint is kept (`path`, outside the log directory), and
    whether the operator asked to start a new log under a new origin (`new_origin`: a file
    recording another origin is then replaced, never a file recording this one, nor one
    that recorded this origin before and holds more of it than the directory)."""

    __slots__ = ("_notes", "_size", "new_origin", "path")

    def __init__(self, path: Path, new_origin: bool = False) -> None:
        self.path = path
        self.new_origin = new_origin
        self._notes: list[tuple[Checkpoint, bytes]] | None = None  # as last read or written
        self._size = 0  # bytes of the file as last read or written

    def __repr__(self) -> str:
        return f"HighWater({str(self.path)!r}, new_origin={self.new_origin})"

    def read(self) -> Checkpoint | None:
        """The checkpoint the file records for the current log; None when there is no
        file."""
        notes = self._read()
        return notes[0][0] if notes else None

    def retired(self) -> list[Checkpoint]:
        """The last checkpoints of the logs the file recorded before the current one."""
        return [checkpoint for checkpoint, _ in self._read()[1:]]

    def _read(self) -> list[tuple[Checkpoint, bytes]]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            self._notes, self._size = [], 0
            return []
        except OSError as exc:
            raise LogCorruptedError(f"cannot read {self.path}: {exc.strerror}") from exc
        try:
            try:
                check_opened(fd, self.path)  # an admin API candidate's: under its roots
            except OSError as exc:
                raise LogCorruptedError(f"cannot read {self.path}: {exc.strerror}") from exc
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LogCorruptedError(f"{self.path} is not a regular file")
            data = os.read(fd, MAX_FILE + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_FILE:
            raise HighWaterFullError(
                f"{self.path} is larger than a high-water file ({MAX_FILE} bytes): it is "
                "not read past that. A file that grew so keeps the last checkpoints of "
                "about 2,000 logs left behind with --new-log-origin; keep its first note "
                "(the current log's) and the retired origins that may ever be used again, "
                'drop the others (docs/provenance.md, "Starting over")'
            )
        self._notes, self._size = _parse(data, self.path), len(data)
        return self._notes

    def check(self, directory: Path, origin: str, signed: Checkpoint | None) -> int | None:
        """Refuse (`LogForkError`) to go on from `signed` (the directory's newest signed
        checkpoint, None for no log) unless it extends the checkpoint the file records for
        `origin`. Returns the recorded size when the file is this log's, else None."""
        notes = self._read()
        if not notes:
            return None
        recorded = notes[0][0]
        if recorded.origin != origin:
            retired = next((c for c, _ in notes[1:] if c.origin == origin), None)
            if not self.new_origin:
                raise LogForkError(
                    f"{self.path} records the log {recorded.origin!r} (signed up to size "
                    f"{recorded.size}), not {origin!r}: provenance.origin changed, or two "
                    f"logs share this file. To start a new log under {origin!r}, start once "
                    "with --new-log-origin (env OWNGATE_NEW_LOG_ORIGIN=1); to go on with "
                    f"{recorded.origin!r}, set provenance.origin back to it; give each "
                    "replica its own provenance.high_water_file"
                )
            if retired is None:
                if self._size > MAX_RETIRING:
                    raise HighWaterFullError(
                        f"{self.path} records {len(notes) - 1} logs left behind already "
                        f"({self._size} bytes, past {MAX_RETIRING}): it leaves no further "
                        f"log behind, so {recorded.origin!r} cannot be retired for "
                        f"{origin!r}. Drop from it the notes of retired origins that will "
                        "never be used again, keeping the first (docs/provenance.md, "
                        '"Starting over")'
                    )
                return None  # the new log's first checkpoint replaces the file
            _extends(self.path, directory, retired, signed, retired=True)
            return None  # recorded again (as the current log) with its first checkpoint
        _extends(self.path, directory, recorded, signed, retired=False)
        return recorded.size

    def write(self, note: bytes) -> None:
        """Record `note` (a checkpoint just made durable in the log) atomically, keeping
        the log the file recorded before when `note` is another's (retired); raises
        OSError. The path is resolved first: a link stays a link."""
        kept = self._notes if self._notes is not None else self._read()
        notes = _distinct([*_parse(note, self.path), *kept])
        path = Path(os.path.realpath(self.path))
        data = b"\n".join(n for _, n in notes)
        write_files_atomically([(path, data)], root=Path(path.anchor))
        self._notes, self._size = notes, len(data)


def _distinct(notes: list[tuple[Checkpoint, bytes]]) -> list[tuple[Checkpoint, bytes]]:
    """`notes` with each origin's first only."""
    seen: set[str] = set()
    kept = []
    for checkpoint, note in notes:
        if checkpoint.origin not in seen:
            seen.add(checkpoint.origin)
            kept.append((checkpoint, note))
    return kept


def _extends(
    path: Path, directory: Path, recorded: Checkpoint, signed: Checkpoint | None, *, retired: bool
) -> None:
    """Refuse (`LogForkError`) unless `signed` (the directory's, None for no log) reaches
    `recorded` and holds its tree there."""
    origin = recorded.origin
    size = 0 if signed is None else signed.size
    which = "the retired log" if retired else "the log"
    if size < recorded.size:
        holds = "no log" if signed is None else f"a log signed only up to size {size}"
        way_on = (
            f"start the new log under an origin never used before ({origin!r} was left "
            "behind for another log)"
            if retired
            else f"to leave that log behind, {NEW_ORIGIN_HINT}"
        )
        raise LogForkError(
            f"{directory} holds {holds}, but {which} {origin!r} already signed a "
            f"checkpoint of size {recorded.size} (recorded in {path}): going on "
            "would fork it (a second tree under the same origin and key). Restore the "
            f"log directory from a backup that reaches size {recorded.size}; or, "
            f"{way_on}"
        )
    if (
        signed is not None
        and recorded.size
        and _root(directory, signed, recorded.size) != (recorded.root)
    ):
        raise LogForkError(
            f"{directory} holds another tree than {which} {origin!r} signed: its tree "
            f"at size {recorded.size} is not the one recorded in {path}, so this "
            "directory is another log under the same origin (a fork). Restore the log "
            f"that signed it; or, to leave that log behind, {NEW_ORIGIN_HINT}"
        )


def _parse(data: bytes, path: Path) -> list[tuple[Checkpoint, bytes]]:
    """The notes of a high-water file: the current log's, then the retired ones'."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LogCorruptedError(f"{path} is not UTF-8") from exc
    # A note is its text, a blank line and its signatures; notes are joined by a blank
    # line: the parts between blank lines alternate text, signatures.
    parts = text.split("\n\n")
    if len(parts) % 2 or not text.endswith("\n"):
        raise LogCorruptedError(f"{path} does not hold checkpoints")
    notes = []
    for body, signatures in zip(parts[::2], parts[1::2], strict=True):
        note = f"{body}\n\n{signatures.removesuffix(chr(10))}\n"
        try:
            checkpoint = Checkpoint.parse(body + "\n")
        except MalformedError as exc:
            raise LogCorruptedError(f"{path} does not hold a checkpoint: {exc}") from exc
        notes.append((checkpoint, note.encode()))
    return notes


def _root(directory: Path, signed: Checkpoint, size: int) -> bytes:
    """The root of the log's tree at `size` (at most `signed.size`), from its tiles."""
    if size == signed.size:
        return signed.root
    try:
        return range_hash(0, size, TileReader(directory, signed.size).node)
    except (MalformedError, OSError) as exc:
        raise LogCorruptedError(f"cannot rebuild the tree at size {size}: {exc}") from exc
