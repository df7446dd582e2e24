"""The write-ahead segment: where appended entries become durable before any tile exists.

A segment `wal/<first index, 20 digits>.wal` is a sequence of frames
`uint16 length (big-endian) || entry || SHA-256(0x00 || entry)`; the trailing RFC 6962 leaf
hash doubles as the frame's checksum. A frame that is cut short or whose hash does not match
marks the end of the valid data: after a crash that is a torn tail, which the writer cuts.
Segments are deleted once a signed checkpoint covers their entries (the entries then live in
the tlog-tiles entry bundles).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gateway.provenance.files import fsync_directory
from gateway.provenance.merkle import HASH_SIZE, leaf_hash

__all__ = [
    "SegmentScan",
    "SegmentWriter",
    "encode_frame",
    "list_segments",
    "scan_segment",
    "segment_path",
]

_SUFFIX = ".wal"
_PROBE_BYTES = 4096  # what `SegmentWriter.probe` writes: one page


def encode_frame(entry: bytes, leaf: bytes) -> bytes:
    return struct.pack(">H", len(entry)) + entry + leaf


def segment_path(directory: Path, first_index: int) -> Path:
    return directory / f"{first_index:020d}{_SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """Segments in order of their first index; stray files are ignored."""
    if not directory.is_dir():
        return []
    found: list[tuple[int, Path]] = []
    for path in directory.iterdir():
        stem = path.name[: -len(_SUFFIX)]
        if path.name.endswith(_SUFFIX) and stem.isdecimal() and len(stem) == 20:
            found.append((int(stem), path))
    return sorted(found)


@dataclass(frozen=True, slots=True)
class SegmentScan:
    first_index: int
    entries: list[tuple[bytes, bytes]]  # (entry, leaf hash)
    valid_bytes: int
    total_bytes: int

    @property
    def torn(self) -> bool:
        return self.valid_bytes != self.total_bytes


def scan_segment(path: Path, first_index: int) -> SegmentScan:
    data = path.read_bytes()
    entries: list[tuple[bytes, bytes]] = []
    offset = 0
    while offset + 2 <= len(data):  # bounded: each frame consumes at least 34 bytes
        (length,) = struct.unpack_from(">H", data, offset)
        end = offset + 2 + length + HASH_SIZE
        if end > len(data):
            break
        entry = data[offset + 2 : offset + 2 + length]
        leaf = data[offset + 2 + length : end]
        if leaf_hash(entry) != leaf:
            break
        entries.append((entry, leaf))
        offset = end
    return SegmentScan(first_index, entries, offset, len(data))


class SegmentWriter:
    """Appends frames to one segment, each append durable when it returns; undoes a failed
    append.

    The segment is opened with O_DSYNC: a write returns only once its data (and the file
    size it grew to) is on stable storage, as if followed by fdatasync, in one system call.
    The writer thread gives the GIL away for that call, and every extra call is another
    wait for it when the event loop is busy.
    """

    def __init__(self, path: Path, *, valid_bytes: int) -> None:
        self.path = path
        self.valid_bytes = valid_bytes
        self._needs_truncate = False
        existed = path.exists()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DSYNC, 0o644)
        try:
            if existed:
                os.ftruncate(self._fd, valid_bytes)
            os.fsync(self._fd)
            if not existed:
                fsync_directory(path.parent)
        except OSError:
            os.close(self._fd)
            if not existed:
                path.unlink(missing_ok=True)
            raise

    def append(self, data: bytes) -> None:
        """Write `data` durably after the valid bytes; on failure nothing is appended."""
        try:
            if self._needs_truncate:
                os.ftruncate(self._fd, self.valid_bytes)
                self._needs_truncate = False
            view = memoryview(data)
            offset = self.valid_bytes
            while view:  # bounded: each pwrite consumes at least one byte or raises
                written = os.pwrite(self._fd, view, offset)
                view = view[written:]
                offset += written
        except OSError:
            self._needs_truncate = True
            try:
                os.ftruncate(self._fd, self.valid_bytes)
                self._needs_truncate = False
            except OSError:
                pass  # retried before the next append; the error below is what matters
            raise
        self.valid_bytes += len(data)

    def probe(self) -> None:
        """Raise the OSError an append would raise now (full disk, lost permission),
        appending nothing: a block of zeros is written durably where the next frame goes,
        then cut off, as a failed append is. A crash in between leaves a torn tail, which
        recovery cuts."""
        self.append(bytes(_PROBE_BYTES))  # a failure is undone (or left to undo) there
        self.valid_bytes -= _PROBE_BYTES
        self._needs_truncate = True
        self._cut()  # durable too, should a snapshot close this segment

    def close(self, *, cut: bool = True) -> None:
        """Close the segment, first cutting off what a failed write may have left after the
        valid bytes (a segment that is not the last must end with a whole frame). If that
        cut fails, the OSError is raised and the segment stays open, to be tried again.
        `cut=False` closes without it: for the last segment, whose torn tail recovery
        cuts."""
        if cut and self._needs_truncate:
            self._cut()
        os.close(self._fd)

    def _cut(self) -> None:
        """Cut the file back to its valid bytes, durably."""
        os.ftruncate(self._fd, self.valid_bytes)
        os.fsync(self._fd)
        self._needs_truncate = False
