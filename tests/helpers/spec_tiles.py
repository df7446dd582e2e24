"""The tlog-tiles half of the from-the-spec verifier (tests/helpers/spec_verifier.py):
C2SP tlog-tiles paths, the tiles and entry bundles a tree of a size is made of, fetched
over HTTP or from a directory, each checked against the others and the checkpoint's root
recomputed from them. Standard library and `cryptography` only.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.spec_verifier import (
    HASH,
    WIDTH,
    Checkpoint,
    Key,
    check,
    leaf_hash,
    mth,
    parse_checkpoint,
)

__all__ = [
    "Fetched",
    "Tree",
    "absent_tiles",
    "from_directory",
    "from_url",
    "read_tree",
    "tile_index",
    "tile_path",
    "tiles_for",
]


# --- tlog-tiles ----------------------------------------------------------------------


def tile_index(n: int) -> str:
    """`<N>`: zero-padded 3-digit elements, all but the last prefixed `x`."""
    groups = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        groups.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(groups))


def tile_path(level: int | str, n: int, width: int = WIDTH) -> str:
    suffix = "" if width == WIDTH else f".p/{width}"
    return f"tile/{level}/{tile_index(n)}{suffix}"


@dataclass(frozen=True)
class Fetched:
    status: int
    content_type: str | None  # None from a directory
    body: bytes
    cache: str | None = None  # Cache-Control


Fetch = Callable[[str], Fetched]


def from_url(prefix: str, token: str | None = None) -> Fetch:
    def fetch(path: str) -> Fetched:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(prefix.rstrip("/") + "/" + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                body = answer.read(1 << 20)
                cache = answer.headers.get("cache-control")
                return Fetched(answer.status, answer.headers.get("content-type"), body, cache)
        except urllib.error.HTTPError as error:
            return Fetched(error.code, error.headers.get("content-type"), b"")

    return fetch


def from_directory(root: Path) -> Fetch:
    def fetch(path: str) -> Fetched:
        file = root / path
        return Fetched(200, None, file.read_bytes()) if file.is_file() else Fetched(404, None, b"")

    return fetch


def _get(fetch: Fetch, path: str, content_type: str) -> bytes:
    got = fetch(path)
    check(got.status == 200, f"tlog-tiles: {path} must be served (got {got.status})")
    if got.content_type is not None:
        check(got.content_type == content_type, f"tlog-tiles: {path} is {content_type}")
    return got.body


@dataclass(frozen=True)
class Tree:
    checkpoint: Checkpoint
    hashes: list[bytes]  # level 0: every leaf hash
    entries: list[bytes]


def tiles_for(size: int) -> list[tuple[int, int, int]]:
    """(level, index, width) of every tile a tree of `size` is made of."""
    tiles: list[tuple[int, int, int]] = []
    level = 0
    while size >> (8 * level):
        count = size >> (8 * level)
        tiles += [(level, n, WIDTH) for n in range(count // WIDTH)]
        if count % WIDTH:
            tiles.append((level, count // WIDTH, count % WIDTH))
        level += 1
    return tiles


def _tile(fetch: Fetch, kind: int | str, n: int, width: int, size: int) -> tuple[bytes, int]:
    """A tile (or bundle) of a tree of `size`: its partial form, or, where the log has
    deleted that once the full tile came (tlog-tiles allows it), the full tile's start;
    and the width the body holds."""
    path = tile_path(kind, n, width)
    got, held = fetch(path), width
    if got.status == 404 and width < WIDTH:
        got, held = fetch(tile_path(kind, n)), WIDTH
        check(got.status == 200, f"tlog-tiles: {path} (size {size}) or its full tile")
        if kind != "entries":
            check(len(got.body) == WIDTH * HASH, "tlog-tiles: a full tile is 8,192 bytes")
            got, held = Fetched(200, got.content_type, got.body[: width * HASH]), width
    check(got.status == 200, f"tlog-tiles: {path} must be served (got {got.status})")
    if got.content_type is not None:
        check(got.content_type == "application/octet-stream", "tlog-tiles: octet-stream")
    return got.body, held


def read_tree(fetch: Fetch, keys: list[Key], origin: str, note: bytes | None = None) -> Tree:
    """The checkpoint (the served one, or `note`, one saved earlier), every tile and
    bundle its size needs, each checked against the others and the root recomputed."""
    if note is None:
        note = _get(fetch, "checkpoint", "text/plain; charset=utf-8")
    checkpoint = parse_checkpoint(note, keys, origin)
    size = checkpoint.size
    levels: dict[int, list[bytes]] = {}
    for level, n, width in tiles_for(size):
        body, _ = _tile(fetch, level, n, width, size)
        check(len(body) == width * HASH, f"tlog-tiles: tile {level}/{n} is {width} hashes")
        levels.setdefault(level, []).extend(body[i : i + HASH] for i in range(0, len(body), HASH))
    hashes = levels.get(0, [])
    check(len(hashes) == size, "tlog-tiles: level 0 holds a hash per entry")
    for level, tile_hashes in levels.items():
        span = WIDTH**level
        for i, got in enumerate(tile_hashes):
            check(
                got == mth(hashes[i * span : (i + 1) * span]),
                f"tlog-tiles: level {level} hash {i} is the MTH of the tiles below",
            )
    check(mth(hashes) == checkpoint.root, "tlog-tiles: the tiles' root is the checkpoint's")
    entries: list[bytes] = []
    for _, n, width in (t for t in tiles_for(size) if t[0] == 0):
        body, held = _tile(fetch, "entries", n, width, size)
        bundle: list[bytes] = []
        at = 0
        while at < len(body):
            check(at + 2 <= len(body), "tlog-tiles: a bundle entry has a uint16 length")
            length = int.from_bytes(body[at : at + 2], "big")
            check(at + 2 + length <= len(body), "tlog-tiles: a bundle entry is cut short")
            bundle.append(body[at + 2 : at + 2 + length])
            at += 2 + length
        check(len(bundle) == held, f"tlog-tiles: bundle {n} holds {held} entries")
        entries += bundle[:width]
    for i, entry in enumerate(entries):
        check(leaf_hash(entry) == hashes[i], f"tlog-tiles: entry {i} hashes to its tile")
    return Tree(checkpoint, hashes, entries)


def absent_tiles(size: int) -> list[str]:
    """Paths a tree of `size` has no tile for (while it stays that size): the next full
    tile of each level, a partial one wider than its level's, the level above the top,
    an empty partial, and non-canonical spellings of tiles that exist."""
    paths = []
    for level in range(0, 3):
        count = size >> (8 * level)
        paths.append(tile_path(level, count // WIDTH + (1 if count % WIDTH else 0)))
        if count % WIDTH < WIDTH - 1:
            paths.append(tile_path(level, count // WIDTH, count % WIDTH + 1))
    paths += ["tile/0/000.p/0", "tile/entries/000.p/0"]
    if size >= WIDTH:
        paths += ["tile/0/0", "tile/00/000", "tile/0/x000/000", "tile/entries/0"]
    if size % WIDTH:
        paths.append(f"tile/0/{tile_index(size // WIDTH)}.p/0{size % WIDTH}")
    return paths
