"""The write-ahead segment: where appended entries become durable before any tile exists.

A segment `wal/<first index, 20 digits>.wal` is a sequence of frames
`uint16 length (big-endian) || entry || SHA-256(0x00 || entry)`; the trailing RFC 6962 leaf
hash doubles as the frame's checksum. A frame that is cut short or whose hash does not match
marks the end of the valid data: after a crash that is a torn tail, which the writer cuts.
Segments are deleted once a signed checkpoint covers their entries (the entries then live in
the tlog-tiles entry bundles). This module is the format (frames, names, scanning); the
writer appends through `writer.segment_writer.SegmentWriter`.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.layout import NOT_A_FILE, is_index_name
from gateway.provenance.formats.merkle import HASH_SIZE, leaf_hash

__all__ = [
    "SegmentScan",
    "encode_frame",
    "iter_segment",
    "list_segments",
    "scan_segment",
    "segment_path",
]

_SUFFIX = ".wal"


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
        if path.name.endswith(_SUFFIX) and is_index_name(stem):
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
    """The segment's valid frames, read one at a time up to the first torn or bad one (a
    sparse file of gigabytes handed to an auditor is never read whole). MalformedError
    when it is not a regular file: it is opened without waiting (a FIFO put in its place,
    even after a caller's check, would block the open for a writer) and checked open."""
    entries: list[tuple[bytes, bytes]] = []
    offset = 0
    with _open_segment(path) as file:
        for entry, leaf in _frames(file):
            entries.append((entry, leaf))
            offset += 2 + len(entry) + HASH_SIZE
        total = os.fstat(file.fileno()).st_size
    return SegmentScan(first_index, entries, offset, max(total, offset))


def iter_segment(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The segment's valid frames (entry, leaf hash) as `scan_segment` finds them, one at
    a time and none held: an auditor checking a segment the audited operator filled with
    millions of frames stops at the first bad record without holding them all."""
    with _open_segment(path) as file:
        yield from _frames(file)


def _open_segment(path: Path) -> BinaryIO:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno not in NOT_A_FILE:  # a symlink loop, a socket: no file, as a FIFO
            raise
        raise MalformedError(f"write-ahead segment wal/{path.name}: {exc.strerror}") from exc
    file = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        file.close()
        raise MalformedError(f"write-ahead segment wal/{path.name} is not a regular file")
    return file


def _frames(file: BinaryIO) -> Iterator[tuple[bytes, bytes]]:
    while True:  # bounded: each frame consumes at least 34 bytes of the file
        head = file.read(2)
        if len(head) < 2:
            return
        (length,) = struct.unpack(">H", head)
        body = file.read(length + HASH_SIZE)
        if len(body) < length + HASH_SIZE:
            return
        entry, leaf = body[:length], body[length:]
        if leaf_hash(entry) != leaf:
            return
        yield entry, leaf
