"""The growing tiled Merkle tree: compact range for the root, rightmost tile per level.

`TiledTree` is what both the writer and the verifier hold in memory: O(log n) hashes for
the root plus at most 255 hashes per tile level and 255 entries of the open bundle. Each
`append` hands back the tiles and bundles that just became full, as (path, bytes) pairs in
the tlog-tiles layout; `partial_files()` gives the partial ones for the current size.
"""

from __future__ import annotations

from gateway.provenance.formats.merkle import HASH_SIZE, CompactRange, NodeReader, node_hash
from gateway.provenance.formats.tiles import (
    TILE_WIDTH,
    decode_bundle,
    encode_bundle,
    entries_path,
    tile_path,
    tile_widths,
)

__all__ = ["TiledTree"]


def _perfect_root(hashes: list[bytes]) -> bytes:
    while len(hashes) > 1:  # 256 hashes: 8 rounds
        hashes = [node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes), 2)]
    return hashes[0]


class TiledTree:
    """In-memory right edge of a tlog-tiles tree."""

    __slots__ = ("bundle", "compact", "levels")

    def __init__(self) -> None:
        self.compact = CompactRange()
        self.levels: list[list[bytes]] = [[]]  # hashes of the rightmost tile, per level
        self.bundle: list[bytes] = []  # entries of the rightmost (open) bundle

    @property
    def size(self) -> int:
        return self.compact.size

    def root(self) -> bytes:
        return self.compact.root()

    def append(self, entry: bytes, leaf: bytes) -> list[tuple[str, bytes]]:
        """Add one entry; return the full tiles and bundle it completed."""
        index = self.compact.size
        self.compact.append(leaf)
        self.bundle.append(entry)
        done: list[tuple[str, bytes]] = []
        if len(self.bundle) == TILE_WIDTH:
            done.append((entries_path(index // TILE_WIDTH), encode_bundle(self.bundle)))
            self.bundle = []
        carry: bytes | None = leaf
        level = 0
        while carry is not None:  # bounded by the number of levels (<= 8 for 2**64)
            if level == len(self.levels):
                self.levels.append([])
            tile = self.levels[level]
            tile.append(carry)
            carry = None
            if len(tile) == TILE_WIDTH:
                tile_index = index >> (8 * (level + 1))
                done.append((tile_path(level, tile_index), b"".join(tile)))
                carry = _perfect_root(tile)
                self.levels[level] = []
            level += 1
        return done

    def partial_files(self) -> list[tuple[str, bytes]]:
        """The partial tiles and the partial bundle the current size needs."""
        files: list[tuple[str, bytes]] = []
        size = self.compact.size
        for level, index, width in tile_widths(size):
            tile = self.levels[level]
            if len(tile) != width:  # an internal invariant, not an input check
                raise AssertionError(f"level {level} holds {len(tile)} hashes, expected {width}")
            files.append((tile_path(level, index, width), b"".join(tile)))
        if self.bundle:
            index = size // TILE_WIDTH
            files.append((entries_path(index, len(self.bundle)), encode_bundle(self.bundle)))
        return files

    @classmethod
    def restore(
        cls, size: int, read: NodeReader, tile_bytes: dict[int, bytes], bundle: bytes
    ) -> TiledTree:
        """Rebuild from stored data: `tile_bytes[level]` is the rightmost partial tile of each
        level (as `tile_widths(size)` lists them) and `bundle` the partial bundle's bytes."""
        tree = cls()
        tree.compact = CompactRange.from_reader(size, read)
        top = max((level for level, _, _ in tile_widths(size)), default=0)
        tree.levels = [[] for _ in range(top + 1)]
        for level, _, width in tile_widths(size):
            data = tile_bytes[level]
            tree.levels[level] = [data[i * HASH_SIZE : (i + 1) * HASH_SIZE] for i in range(width)]
        tree.bundle = decode_bundle(bundle) if size % TILE_WIDTH else []
        return tree
