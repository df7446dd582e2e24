"""C2SP tlog-tiles layout: tile and entry-bundle paths, the bundle codec, and a tile reader.

Level-L tile N holds MTH(D[(N*256+i)*256**L : (N*256+i+1)*256**L]) for i < width; full
tiles are 256 hashes (8,192 bytes), partial ones `.p/<W>`. Entry bundles hold the entries
as big-endian uint16 length-prefixed byte strings. `TileReader` turns the files of a log
directory into a `merkle.NodeReader`, so any inclusion or consistency proof can be built.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.layout import read_log_file
from gateway.provenance.formats.merkle import HASH_SIZE, node_hash

__all__ = [
    "MAX_BUNDLE_FILE",
    "MAX_ENTRY_SIZE",
    "MAX_TILE_FILE",
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "TileReader",
    "copy_budget",
    "decode_bundle",
    "encode_bundle",
    "encode_entry",
    "entries_path",
    "file_limit",
    "first_of",
    "index_path",
    "length_problem",
    "split_bundle",
    "tile_path",
    "tile_width",
    "tile_widths",
    "tree_files",
]

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
MAX_ENTRY_SIZE = 0xFFFF
MAX_TILE_FILE = TILE_WIDTH * HASH_SIZE  # a full hash tile
MAX_BUNDLE_FILE = TILE_WIDTH * (2 + MAX_ENTRY_SIZE)  # a full bundle of the largest entries


def file_limit(name: str) -> int:
    """The most bytes the tile or entry bundle at `name` (a `tile/...` path) may hold."""
    return MAX_BUNDLE_FILE if name.startswith("tile/entries/") else MAX_TILE_FILE


def length_problem(name: str, length: int) -> str | None:
    """Why a served file of `length` bytes cannot be the tile or bundle at `name` (a
    `tile/...` path, `.p/<W>` or full), or None: a hash tile is exactly its width in
    hashes, a bundle at least a 2-byte length prefix for each of its width's entries."""
    width = tile_width(name)
    if not name.startswith("tile/entries/"):
        if length != width * HASH_SIZE:
            return f"{length} bytes, not the {width * HASH_SIZE} of {width} hashes"
    elif length < width * 2:
        return f"{length} bytes, less than the {width * 2} of {width} entries' length prefixes"
    return None


def first_of(name: str, full: bytes) -> bytes | str:
    """The partial tile or bundle at `name` (`.p/<W>`) cut from `full`, the bytes of its
    full file (a log serves that once the partial one is gone; its first W hashes or
    entries are the partial one's), or why it cannot be: fewer than W whole entries."""
    width = tile_width(name)
    if not name.startswith("tile/entries/"):
        return full[: width * HASH_SIZE]  # a full tile: exactly 256 hashes (length_problem)
    entries, _ = split_bundle(full)
    if len(entries) < width:
        return f"a bundle of {len(entries)} whole entries, fewer than {width}"
    return full[: sum(2 + len(entry) for entry in entries[:width])]


def copy_budget(size: int) -> int:
    """The most bytes the tiles and entry bundles of a tree of `size` leaves can take: each
    hash tile 32 bytes a hash, each bundle 2 + 65535 bytes an entry. (A partial file may
    be served full, so each level's last tile is counted full.)"""
    total, hashes = 0, size
    while hashes:  # bounded: a level holds 256 times fewer hashes than the one below
        total += -(-hashes // TILE_WIDTH) * MAX_TILE_FILE
        hashes //= TILE_WIDTH
    return total + -(-size // TILE_WIDTH) * MAX_BUNDLE_FILE


def tile_width(name: str) -> int:
    """The width a tile or bundle path names (`.p/<W>`), else a full tile's."""
    _, partial, width = name.partition(".p/")
    return int(width) if partial else TILE_WIDTH


def tree_files(size: int) -> Iterator[tuple[str, str | None]]:
    """The tiles of a tree of `size` leaves, level by level, each with its entry bundle
    (level 0) or None."""
    level, scale = 0, 1
    while size >= scale:  # bounded: scale grows 256-fold each level
        hashes = size // scale  # the hashes of this level
        for n in range(hashes // TILE_WIDTH):
            yield tile_path(level, n), entries_path(n) if level == 0 else None
        if hashes % TILE_WIDTH:
            n, width = hashes // TILE_WIDTH, hashes % TILE_WIDTH
            yield tile_path(level, n, width), entries_path(n, width) if level == 0 else None
        level += 1
        scale *= TILE_WIDTH


def index_path(index: int) -> str:
    """Tile index as zero-padded 3-digit path elements, all but the last prefixed with x."""
    if index < 0:
        raise ValueError("tile index is negative")
    groups = [f"{index % 1000:03d}"]
    index //= 1000
    while index:  # bounded by the number of decimal digit groups
        groups.append(f"x{index % 1000:03d}")
        index //= 1000
    return "/".join(reversed(groups))


def _suffix(width: int) -> str:
    if not 0 < width <= TILE_WIDTH:
        raise ValueError(f"tile width {width} is outside 1..256")
    return "" if width == TILE_WIDTH else f".p/{width}"


def tile_path(level: int, index: int, width: int = TILE_WIDTH) -> str:
    return f"tile/{level}/{index_path(index)}{_suffix(width)}"


def entries_path(index: int, width: int = TILE_WIDTH) -> str:
    return f"tile/entries/{index_path(index)}{_suffix(width)}"


def tile_widths(size: int) -> Iterator[tuple[int, int, int]]:
    """(level, index, width) of the rightmost, partial tile at each level of a tree."""
    level, scale = 0, 1
    while size >= scale:  # bounded: scale grows 256-fold each level
        width = (size // scale) % TILE_WIDTH
        if width:
            yield level, size // (scale * TILE_WIDTH), width
        level += 1
        scale *= TILE_WIDTH


def encode_entry(entry: bytes) -> bytes:
    if len(entry) > MAX_ENTRY_SIZE:
        raise ValueError(f"entry of {len(entry)} bytes exceeds the {MAX_ENTRY_SIZE}-byte limit")
    return struct.pack(">H", len(entry)) + entry


def encode_bundle(entries: list[bytes]) -> bytes:
    return b"".join(encode_entry(entry) for entry in entries)


def split_bundle(data: bytes) -> tuple[list[bytes], int]:
    """Every whole entry of a bundle, and the bytes they take (less than `len(data)` when
    the file ends inside a length prefix or an entry)."""
    entries: list[bytes] = []
    offset = 0
    while offset + 2 <= len(data):  # bounded: each round consumes at least two bytes
        (length,) = struct.unpack_from(">H", data, offset)
        if offset + 2 + length > len(data):
            break
        entries.append(data[offset + 2 : offset + 2 + length])
        offset += 2 + length
    return entries, offset


def decode_bundle(data: bytes, *, where: str = "entry bundle") -> list[bytes]:
    entries, offset = split_bundle(data)
    if offset + 2 > len(data) > offset:
        raise MalformedError(f"{where}: truncated length prefix at byte {offset}")
    if offset < len(data):
        raise MalformedError(f"{where}: entry {len(entries)} is cut short")
    if len(entries) > TILE_WIDTH:
        raise MalformedError(f"{where}: holds {len(entries)} entries, more than 256")
    return entries


class TileReader:
    """Read tile hashes of a tlog-tiles directory for a tree of `size` (a checkpoint's).

    `node(height, index)` is a `merkle.NodeReader`. Tiles are read once and kept in a
    small LRU cache. Full tiles are preferred; the rightmost tile of each level falls back
    to the partial width that `size` implies.
    """

    def __init__(self, root: Path, size: int, *, cache_tiles: int = 64) -> None:
        self._root = root
        self._size = size
        self._cache: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._cache_tiles = cache_tiles

    def tile(self, level: int, index: int) -> bytes:
        key = (level, index)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        data = self._read_tile(level, index)
        self._cache[key] = data
        if len(self._cache) > self._cache_tiles:
            self._cache.popitem(last=False)
        return data

    def _read_tile(self, level: int, index: int) -> bytes:
        scale = TILE_WIDTH**level
        available = self._size // scale - index * TILE_WIDTH
        if available <= 0:
            raise MalformedError(f"tile {level}/{index} lies beyond tree size {self._size}")
        width = min(available, TILE_WIDTH)
        candidates = [tile_path(level, index)]
        if width < TILE_WIDTH:
            candidates.append(tile_path(level, index, width))
        for name in candidates:
            try:
                data = read_log_file(self._root / name, MAX_TILE_FILE)
            except FileNotFoundError:
                continue
            if len(data) < width * HASH_SIZE or len(data) % HASH_SIZE:
                raise MalformedError(f"{name} is {len(data)} bytes; expected {width} hashes")
            return data[: width * HASH_SIZE]
        raise MalformedError(f"missing tile {candidates[-1]} for tree size {self._size}")

    def node(self, height: int, index: int) -> bytes:
        """Hash of the complete subtree at (height, index), computed from one tile."""
        level, rest = divmod(height, TILE_HEIGHT)
        span = 1 << rest
        first = index * span  # position among the level's tile hashes
        tile = self.tile(level, first // TILE_WIDTH)
        offset = first % TILE_WIDTH
        hashes = [
            tile[position * HASH_SIZE : (position + 1) * HASH_SIZE]
            for position in range(offset, offset + span)
        ]
        while len(hashes) > 1:  # a perfect subtree: log2(span) <= 7 rounds
            hashes = [node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes), 2)]
        return hashes[0]
