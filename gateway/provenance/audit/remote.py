"""A log served over HTTP as C2SP tlog-tiles (`checkpoint`, `tile/<L>/<N>[.p/<W>]`,
`tile/entries/<N>[.p/<W>]`, e.g. by owngate's admin API under /log/), copied into a
directory laid out like a log directory, so `verify_log` audits it like a copied one.

Standard library only (urllib): an auditor installs `gateway.provenance` and nothing else.
The served checkpoint is fetched first and, given the log's keys, verified before
anything else is (its tree size is the server's word until then: a hostile server could
claim any size); then exactly the tiles and bundles its tree size needs are fetched
(tiles only grow, so later ones still hold it), one at a time, so the first one missing
ends the copy. tlog-tiles serves no checkpoint history: the copy's history is that one
checkpoint; earlier ones an auditor holds are checked with `--checkpoint` as usual.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.checkpoint import open_checkpoint
from gateway.provenance.formats.layout import CHECKPOINT, history_path
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.tiles import TILE_WIDTH, entries_path, tile_path

__all__ = ["is_url", "mirror_log"]

_MAX_BYTES = 1 << 20  # a tile is 8 KiB, a bundle at most 256 * 64 KiB: refuse anything else
_MAX_BUNDLE = TILE_WIDTH * (2 + 0xFFFF)


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def mirror_log(
    url: str,
    directory: Path,
    *,
    token: str | None = None,
    timeout_s: float = 30.0,
    verifiers: Sequence[Verifier] = (),
    origin: str | None = None,
) -> int:
    """Copy the log at `url` (the prefix under which `checkpoint` is served) into
    `directory`; returns the checkpoint's tree size. With `verifiers` (and `origin`), the
    served checkpoint must be signed by one of them before a tile is fetched (else
    SignatureError or MalformedError). Raises MalformedError when the server lacks a file
    the checkpoint needs, OSError when it cannot be reached."""
    if not is_url(url):
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    base = url.rstrip("/") + "/"
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def fetch(name: str, limit: int = _MAX_BYTES) -> bytes | None:
        request = urllib.request.Request(base + name, headers=headers)  # noqa: S310 - http(s) only, checked above
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
                data: bytes = response.read(limit + 1)
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the answer's connection open
            if exc.code == 404:
                return None
            raise OSError(f"GET {base}{name}: HTTP {exc.code}") from exc
        if len(data) > limit:
            raise MalformedError(f"{name} is larger than {limit} bytes")
        return data

    note = fetch(CHECKPOINT)
    if note is None:
        raise MalformedError(f"{base}{CHECKPOINT} is not served")
    if verifiers:
        size = open_checkpoint(note, verifiers, origin=origin).checkpoint.size
    else:
        size = _tree_size(note)
    _write(directory / CHECKPOINT, note)
    _write(history_path(directory, size), note)
    for tile, bundle in _files(size):  # one at a time: never a list as long as the log
        for name, limit in ((tile, _MAX_BYTES), (bundle, _MAX_BUNDLE)):
            if name is None:
                continue
            data = fetch(name, limit)
            if data is None and ".p/" in name:  # grown since: the full file holds it
                name = name.partition(".p/")[0]
                data = fetch(name, limit)
            if data is None:
                raise MalformedError(f"{base}{name} is not served (tree size {size})")
            _write(directory / name, data)
    return size


def _files(size: int) -> Iterator[tuple[str, str | None]]:
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


def _tree_size(note: bytes) -> int:
    lines = note.split(b"\n")
    if len(lines) < 3 or not lines[1].isdigit():
        raise MalformedError("the served checkpoint has no tree size on its second line")
    return int(lines[1])


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
