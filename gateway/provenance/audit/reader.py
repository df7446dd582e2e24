"""Read-only access to a log directory for auditors: checkpoints, entries, lookups.

Nothing here trusts the files: `verify` checks them. `LogDirectory` only knows where the
tlog-tiles layout (and the write-ahead segments) keep things.

A live gateway's log moves while it is read: a checkpoint writes its history file, then
the `checkpoint` file, and a reading between the two sees a "rollback". `read_settled`
reads again (`READINGS` in all) when a reading failed and the log moved meanwhile
(`log_state`); a failure on a log that did not move is the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from gateway.provenance.errors import LogVerificationError, MalformedError, RecordError
from gateway.provenance.formats.layout import (
    CHECKPOINT,
    MAX_HISTORY,
    WAL,
    list_history,
    newest_history,
    read_log_file,
)
from gateway.provenance.formats.merkle import HASH_SIZE, CompactRange, leaf_hash
from gateway.provenance.formats.records import Record, parse_record
from gateway.provenance.formats.tiles import (
    TILE_WIDTH,
    decode_bundle,
    entries_path,
    file_limit,
    split_bundle,
    tile_path,
)
from gateway.provenance.formats.wal import iter_segment, list_segments

__all__ = ["READINGS", "LogDirectory", "log_state", "read_settled"]

READINGS = 3  # readings of a log that moved while it was read, at most
_T = TypeVar("_T")


def log_state(path: str | Path) -> tuple[bytes, str]:
    """What moves when a checkpoint is written: the `checkpoint` file's bytes and the
    newest history entry's name (empty when absent)."""
    try:
        checkpoint = read_log_file(Path(path) / CHECKPOINT)
    except (FileNotFoundError, NotADirectoryError):
        checkpoint = b""
    newest = newest_history(Path(path))
    return checkpoint, newest[1].name if newest else ""


def read_settled(
    path: str | Path, read: Callable[[], _T], failed: Callable[[_T], bool] = lambda _: False
) -> _T:
    """`read()` of the log at `path`, again while it raised `LogVerificationError` (or gave
    a result `failed` says is a failure) and the log moved during it (`READINGS` readings
    at most); the last reading's error or result stands."""
    for _ in range(READINGS - 1):
        before = log_state(path)
        try:
            result = read()
        except LogVerificationError:
            if log_state(path) == before:
                raise
            continue
        if not failed(result) or log_state(path) == before:
            return result
    return read()


class LogDirectory:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise MalformedError(f"{self.path} is not a directory")

    def history(self, limit: int = MAX_HISTORY) -> list[tuple[int, Path]]:
        """(size, path) of every history checkpoint, smallest first; MalformedError past
        `limit` of them."""
        return list_history(self.path, limit)

    def latest_note(self) -> bytes:
        """The served `checkpoint` file's bytes."""
        try:
            return read_log_file(self.path / CHECKPOINT)
        except FileNotFoundError as exc:
            raise MalformedError(f"{self.path} has no checkpoint file") from exc

    def _first_existing(self, names: list[str]) -> tuple[str, bytes] | None:
        for name in names:
            try:
                return name, read_log_file(self.path / name, file_limit(name))
            except FileNotFoundError:
                continue
        return None

    @staticmethod
    def _names(path: Callable[[int, int], str], index: int, size: int) -> list[str]:
        """The full file of tile or bundle `index` first, then the partial one `size` needs."""
        count = min(TILE_WIDTH, size - index * TILE_WIDTH)
        names = [path(index, TILE_WIDTH)]
        if count < TILE_WIDTH:
            names.append(path(index, count))
        return names

    def bundle(self, index: int, size: int) -> list[bytes]:
        """Entries of bundle `index` as far as a tree of `size` reaches (full file first)."""
        count = min(TILE_WIDTH, size - index * TILE_WIDTH)
        names = self._names(entries_path, index, size)
        found = self._first_existing(names)
        if found is None:
            raise MalformedError(f"entry bundle {names[-1]} is missing")
        name, data = found
        entries = decode_bundle(data, where=name)
        if len(entries) < count:
            raise MalformedError(f"entry bundle {name} holds {len(entries)} entries, not {count}")
        return entries[:count]

    def level0_tile(self, index: int, size: int) -> bytes:
        """Leaf hashes of level-0 tile `index` as far as a tree of `size` reaches."""
        count = min(TILE_WIDTH, size - index * TILE_WIDTH)
        names = self._names(_level0_path, index, size)
        found = self._first_existing(names)
        if found is None:
            raise MalformedError(f"tile {names[-1]} is missing")
        name, data = found
        if len(data) < count * HASH_SIZE:
            raise MalformedError(f"tile {name} holds fewer than {count} hashes")
        return data[: count * HASH_SIZE]

    # For locating damage once `bundle` or `level0_tile` failed: what is there, leniently.

    def bundle_prefix(self, index: int, size: int) -> tuple[str, list[bytes] | None, bool]:
        """Bundle `index`'s file name; every whole entry in it, up to where the file is cut
        short (None if there is no file); and whether it is cut short."""
        names = self._names(entries_path, index, size)
        found = self._first_existing(names)
        if found is None:
            return names[-1], None, False
        name, data = found
        entries, taken = split_bundle(data)
        return name, entries, taken < len(data)

    def level0_prefix(self, index: int, size: int) -> tuple[str, list[bytes] | None]:
        """Level-0 tile `index`'s file name and its whole leaf hashes, as far as a tree of
        `size` reaches (None if there is no file)."""
        names = self._names(_level0_path, index, size)
        found = self._first_existing(names)
        if found is None:
            return names[-1], None
        name, data = found
        count = min(TILE_WIDTH, size - index * TILE_WIDTH, len(data) // HASH_SIZE)
        return name, [data[i * HASH_SIZE : (i + 1) * HASH_SIZE] for i in range(count)]

    def entries(self, size: int) -> Iterator[tuple[int, bytes]]:
        """(index, entry) for every entry of a tree of `size`, from the entry bundles."""
        for bundle_index in range((size + TILE_WIDTH - 1) // TILE_WIDTH):
            for offset, entry in enumerate(self.bundle(bundle_index, size)):
                yield bundle_index * TILE_WIDTH + offset, entry

    def records(self, size: int) -> Iterator[tuple[int, Record]]:
        for index, entry in self.entries(size):
            try:
                yield index, parse_record(entry)
            except RecordError as exc:
                raise RecordError(f"entry {index}: {exc}") from exc

    def verified_records(self, size: int, root: bytes) -> Iterator[tuple[int, Record]]:
        """`records(size)` of a log `verify_log` found of `size` entries with `root`, read
        again: each entry is hashed as it is read, and after the last the tree must still
        be the verified one, else LogVerificationError (the files changed since the audit
        read them: the operator under audit may swap them between two readings). Checks
        that read the records after `verify_log` (`--backend-pin`, `--backend-key`, a
        sidecar's log) take them from here, and read them all before they pass."""
        tree = CompactRange()
        for index, entry in self.entries(size):
            tree.append(leaf_hash(entry))
            try:
                record = parse_record(entry)
            except RecordError as exc:
                raise RecordError(f"entry {index}: {exc}") from exc
            yield index, record
        if tree.root() != root:
            raise LogVerificationError(
                f"the log at {self.path} changed since it was verified: its entries "
                f"0..{size - 1} no longer hash to the verified root (audit a copy the "
                "operator cannot write)"
            )

    def unsigned_entries(self, size: int) -> Iterator[bytes]:
        """Entries in the write-ahead segments beyond `size` (not yet in a checkpoint), one
        at a time (a segment may hold millions of frames: none is kept).

        Raises LogVerificationError when a segment starts past the entries before it: the
        entries in between were durable once and are gone (the writer refuses to open
        such a log, so the audit must not call it fine).
        """
        end = size  # the index after the last entry found
        for first, path in list_segments(self.path / WAL):
            if first > end:
                raise LogVerificationError(
                    f"write-ahead segment wal/{path.name} starts at entry {first}, but the "
                    f"log holds entries only up to {end - 1}: entries "
                    f"{end}..{first - 1} are missing (deleted before a "
                    "checkpoint covered them)",
                    index=end,
                )
            # MalformedError unless a regular file
            for index, (entry, _) in enumerate(iter_segment(path), start=first):
                if index >= end:
                    yield entry
                    end += 1

    def find_request(self, request_id: str, size: int) -> list[tuple[int, Record]]:
        """Every record of `request_id` in a tree of `size`, in log order."""
        return [(i, r) for i, e, r in self.find_request_entries(request_id, size)]

    def find_request_entries(self, request_id: str, size: int) -> list[tuple[int, bytes, Record]]:
        """(index, entry, record) of every record of `request_id` in a tree of `size`, in
        log order: each record with the very bytes it was parsed from. A check that judges
        a record and proves it proves these bytes, never a second reading of the file (the
        operator under audit may swap it between two readings)."""
        found = []
        for index, entry in self.entries(size):
            try:
                record = parse_record(entry)
            except RecordError as exc:
                raise RecordError(f"entry {index}: {exc}") from exc
            if record.request_id == request_id:
                found.append((index, entry, record))
        return found


def _level0_path(index: int, width: int) -> str:
    return tile_path(0, index, width)
