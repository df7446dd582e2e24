"""Entries replayed from the write-ahead segments at open, checked before they are signed.

Each frame checks only itself (its leaf hash), so a segment with a whole frame taken out,
or a record rewritten with its own hash, still reads as entries in order; replayed
unread, they would be signed into a log that `audit verify` fails (a completion linking
to itself, or to another record). Each one must be a valid record in its own canonical
encoding, and each completion must link to an earlier entry by that entry's leaf hash:
else the log is damaged, and recovery refuses it (`LogCorruptedError`) as it refuses
damage anywhere else.
"""

from __future__ import annotations

from pathlib import Path

from gateway.provenance.errors import LogCorruptedError, MalformedError, RecordError
from gateway.provenance.formats.record_parser import parse_record
from gateway.provenance.formats.tiles import TileReader

__all__ = ["ReplayCheck"]


class ReplayCheck:
    """Checks replayed entries one by one, in log order, on a tree of `signed` entries."""

    def __init__(self, directory: Path, signed: int) -> None:
        self._tiles = TileReader(directory, signed)
        self._signed = signed
        self._leaves: dict[int, bytes] = {}  # the replayed entries' leaf hashes

    def check(self, index: int, entry: bytes, leaf: bytes, segment: str) -> None:
        where = f"entry {index} in the write-ahead segment {segment}"
        try:
            record = parse_record(entry)
        except RecordError as exc:
            raise LogCorruptedError(f"{where} is not a valid record: {exc}") from exc
        self._leaves[index] = leaf
        if record.type != "completion":
            return
        link = record.data["dispatch"]
        target = link["index"]
        if target >= index:
            raise LogCorruptedError(f"{where} is a completion linking to entry {target}")
        if target >= self._signed:
            found = self._leaves.get(target)
        else:
            try:
                found = self._tiles.node(0, target)
            except MalformedError as exc:
                raise LogCorruptedError(f"{where}: entry {target}'s leaf: {exc}") from exc
        if found is None or found.hex() != link["hash"]:
            raise LogCorruptedError(
                f"{where} is a completion whose link names entry {target} by another hash: "
                "a frame was taken out or rewritten, refusing to sign it"
            )
