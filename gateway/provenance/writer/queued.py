"""What the provenance log's committer queues: one record on its way to the write-ahead
segment, encoded on the event loop so that the writer thread only writes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gateway.canonical import canonical_json_of_plain
from gateway.provenance.errors import RecordError
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.records import LogEntry, validate_record
from gateway.provenance.formats.tiles import MAX_ENTRY_SIZE
from gateway.provenance.formats.wal import encode_frame
from gateway.provenance.writer.sealer import Seal, Sealing

__all__ = ["Landing", "Queued", "entry_of", "landed"]


def entry_of(record: Mapping[str, object], checked: bool, encoded: bytes = b"") -> bytes:
    """The log entry of `record`: validated (unless `checked`), in canonical JSON (or
    `encoded`, the caller's, with `checked`), within `MAX_ENTRY_SIZE`; else RecordError."""
    if not checked:
        validate_record(record)
    try:  # a valid record is plain JSON, for which the fast encoder is exact
        entry = encoded if encoded and checked else canonical_json_of_plain(record)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"record cannot be canonicalised: {exc}") from exc
    if len(entry) > MAX_ENTRY_SIZE:
        raise RecordError(f"record is {len(entry)} bytes; the limit is {MAX_ENTRY_SIZE}")
    return entry


class Landing(asyncio.Future[LogEntry]):
    """An awaited entry's future that refuses to be cancelled: a task cancelled while it
    waits on one wakes once the append is done (as if shielded), then raises
    CancelledError, and can still read from it whether its entry landed."""

    def cancel(self, msg: object = None) -> bool:
        return False


class Queued:
    """One queued record: its entry, leaf hash and WAL frame (encoded on the event loop,
    so the writer thread only writes), who waits for it, and its seal if any."""

    __slots__ = ("awaited", "entry", "frame", "future", "leaf", "seal", "sealed")

    def __init__(
        self,
        entry: bytes,
        future: asyncio.Future[LogEntry],
        awaited: bool,
        seal: Seal | None,
        sealed: asyncio.Future[bytes] | None,
    ) -> None:
        self.entry = entry
        self.leaf = leaf_hash(entry)
        self.frame = encode_frame(entry, self.leaf)
        self.future = future
        self.awaited = awaited  # False for append_soon's records
        self.seal = seal
        self.sealed = sealed  # receives seal(entry) when there is a seal

    def compact(self) -> None:
        """Hold the entry in bytes of its own size, for a record kept a while (after a
        failed write): the encoder's output may sit in a buffer ~10x larger."""
        self.entry = bytes(memoryview(self.entry))


def landed(batch: list[Queued], start: int) -> list[Sealing]:
    """Wake the appenders of `batch`, durable from index `start` on; its seals, to run."""
    for index, queued in enumerate(batch, start):
        if not queued.future.done():
            queued.future.set_result(LogEntry(index, queued.leaf))
    return [
        (position, queued.leaf, queued.seal, queued.sealed)
        for position, queued in enumerate(batch)
        if queued.seal is not None and queued.sealed is not None
    ]
