"""Every entry bundle of a reopened log, checked against its newest signed root; tiles rebuilt.

`LogStore.open` goes on from its newest signed checkpoint only once the entry bundles it
covers (the ground truth: a tile only holds hashes computed from them) hash to that
checkpoint's root. `rebuild_tree` reads them in order, one bundle at a time, and
recomputes every tile on the way, so it holds the tree's right edge and the tiles that
need rewriting, never the log. A stored tile that is missing, cut short or altered is
rewritten from the entries once their root matches (it holds nothing they do not). An
entry bundle that is missing, cut short or that does not hash to the signed root is
refused (`LogCorruptedError`, naming the file); one the system cannot read (a file in
place of `tile/`, a permission, EIO) is `LogUnavailableError`, naming the path and the
error, not damage: signing on top of it would extend a tree
other than the one published, and `audit verify` would fail the log.
"""

from __future__ import annotations

from hashlib import sha256
from pathlib import Path

from gateway.provenance.errors import LogCorruptedError, LogUnavailableError, MalformedError
from gateway.provenance.files import write_files_atomically
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.layout import read_log_file
from gateway.provenance.formats.merkle import HASH_SIZE
from gateway.provenance.formats.tiles import (
    MAX_BUNDLE_FILE,
    MAX_TILE_FILE,
    TILE_HEIGHT,
    TILE_WIDTH,
    decode_bundle,
    encode_bundle,
    entries_path,
    tile_path,
    tile_widths,
)
from gateway.provenance.formats.tree import TiledTree

__all__ = ["rebuild_tree"]

_WHAT_TO_DO = (
    "refusing to sign on top of it. Restore the log directory from a backup "
    "(`owngate audit verify` names the first damaged entry), or set provenance.origin to "
    "a new origin and start once with --new-log-origin"
)


def _read(directory: Path, name: str, limit: int) -> bytes | None:
    """The file's bytes; None when it is missing, unreadable as a log file or too large."""
    try:
        return read_log_file(directory / name, limit)
    except (FileNotFoundError, MalformedError):
        return None


def _bundle(directory: Path, index: int, count: int, size: int) -> list[bytes]:
    """The `count` entries of bundle `index` a tree of `size` covers, or LogCorruptedError."""
    # The checkpoint wrote a partial bundle `.p/<count>`; a crash after a later export
    # wrote its files but before its checkpoint may have left the full one beside it.
    names = [entries_path(index)]
    if count < TILE_WIDTH:
        names.insert(0, entries_path(index, count))
    for name in names:
        try:
            data = read_log_file(directory / name, MAX_BUNDLE_FILE)
        except FileNotFoundError:
            continue
        except MalformedError as exc:
            raise _damaged(name, size, f"cannot be read ({exc})") from exc
        except OSError as exc:  # the path, not the data: a file for a directory, EACCES, EIO
            raise LogUnavailableError(
                f"cannot read the entry bundle {directory / name}: {exc.strerror or exc}. "
                "Nothing was changed: make the log directory usable again (a file in place "
                "of one of its directories, permissions, the volume) and restart; "
                "if its files are gone, restore it from a backup"
            ) from exc
        try:
            entries = decode_bundle(data, where=name)
        except MalformedError as exc:
            raise _damaged(name, size, f"is cut short or altered ({exc})") from exc
        width = count if name.endswith(f".p/{count}") else TILE_WIDTH
        if len(entries) != width:
            raise _damaged(name, size, f"holds {len(entries)} entries, not {width}")
        return entries[:count]
    raise _damaged(names[-1], size, "is missing")


def _damaged(name: str, size: int, why: str) -> LogCorruptedError:
    return LogCorruptedError(
        f"entry bundle {name} {why}; the signed checkpoint of size {size} covers its "
        f"entries: {_WHAT_TO_DO}"
    )


class _Edge:
    """The rightmost tile of each level, filled from perfect subtree roots; every tile it
    completes is compared with the stored one, and kept to be rewritten if it differs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.levels: list[list[bytes]] = [[]]
        self.full = [0]  # full tiles so far, per level
        self.repairs: list[tuple[str, bytes]] = []

    def add(self, level: int, hashes: list[bytes]) -> bytes | None:
        """Add hashes to `level`; when its tile is full, check it and carry its root up.
        Returns the stored tile's bytes when it was readable, for the caller's check."""
        while level >= len(self.levels):  # at most one level more per call
            self.levels.append([])
            self.full.append(0)
        tile = self.levels[level]
        tile.extend(hashes)
        if len(tile) < TILE_WIDTH:
            return None
        name, data = tile_path(level, self.full[level]), b"".join(tile)
        stored = _read(self.directory, name, MAX_TILE_FILE)
        if stored != data:
            self.repairs.append((name, data))
        self.full[level] += 1
        self.levels[level] = []
        self.add(level + 1, [_perfect_root(tile)])
        return stored

    def node(self, height: int, index: int) -> bytes:
        """A node of the tree's compact range (a `NodeReader` over the right edge)."""
        level, rest = divmod(height, TILE_HEIGHT)
        span = 1 << rest
        first = index * span % TILE_WIDTH
        return _perfect_root(self.levels[level][first : first + span])


def _perfect_root(hashes: list[bytes]) -> bytes:
    while len(hashes) > 1:  # a tile: at most 8 rounds
        hashes = [
            sha256(b"\x01" + hashes[i] + hashes[i + 1]).digest() for i in range(0, len(hashes), 2)
        ]
    return hashes[0]


def rebuild_tree(directory: Path, checkpoint: Checkpoint) -> tuple[TiledTree, list[str]]:
    """The tree of `checkpoint` rebuilt from its entry bundles, and the tiles (with the
    partial files of its size) that were missing or wrong and are now rewritten."""
    size = checkpoint.size
    edge = _Edge(directory)
    suspect: str | None = None  # the first bundle whose leaves its stored tile contradicts
    bundle: list[bytes] = []
    for index in range((size + TILE_WIDTH - 1) // TILE_WIDTH):
        count = min(TILE_WIDTH, size - index * TILE_WIDTH)
        entries = _bundle(directory, index, count, size)
        leaves = [sha256(b"\x00" + entry).digest() for entry in entries]
        if count < TILE_WIDTH:  # the last bundle: its tile is a partial one
            bundle = entries
            stored = _read(directory, tile_path(0, index, count), MAX_TILE_FILE)
            edge.add(0, leaves)
        else:
            stored = edge.add(0, leaves)
        contradicts = stored is not None and len(stored) == count * HASH_SIZE
        if suspect is None and contradicts and stored != b"".join(leaves):
            suspect = entries_path(index, count)
    tiles = {level: b"".join(edge.levels[level]) for level, _, _ in tile_widths(size)}
    tree = TiledTree.restore(size, edge.node, tiles, encode_bundle(bundle))
    if tree.root() != checkpoint.root:
        where = f": {suspect} does not hash to the leaves its tile holds" if suspect else ""
        raise LogCorruptedError(
            f"the entry bundles in {directory} do not hash to the root of the signed "
            f"checkpoint of size {size}{where} (entries were altered); {_WHAT_TO_DO}"
        )
    repairs = edge.repairs
    for name, data in tree.partial_files():
        limit = MAX_BUNDLE_FILE if name.startswith("tile/entries/") else MAX_TILE_FILE
        if _read(directory, name, limit) != data:
            repairs.append((name, data))
    if repairs:
        try:
            write_files_atomically(
                [(directory / name, data) for name, data in repairs], root=directory
            )
        except OSError as exc:
            why = f"{directory}: {exc.strerror or exc}"
            raise LogUnavailableError(f"cannot rewrite the damaged tiles in {why}") from exc
    return tree, [name for name, _ in repairs]
