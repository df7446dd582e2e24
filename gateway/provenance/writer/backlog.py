"""The entries the log holds in memory until a signed checkpoint covers them, bounded.

An entry is durable once its write-ahead frame is written, but the log keeps it (as an
entry, then inside the tiles and bundles still to write) until a checkpoint export has
written its tiles and signed a checkpoint over it. While exports fail (a tile directory
the disk refuses, a signer that raises) or hang, the write-ahead segment may still take
appends: the entries held grew without bound, and the public log fell ever further behind
what clients held receipts for. Past `LogSettings.max_unsigned_bytes` the log refuses
awaited appends (a dispatch or refusal record: the gateway answers 503
`provenance_unavailable`, no receipt handed out) and is not ready; records nobody waits on
(completions of requests already served) are still written, so the bound is passed by at
most those of the requests in flight. Once an export signs again the entries are
released, in order, and appends are taken again. The start and the end of it are each
reported once (`FaultEvents`).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.provenance.errors import LogUnavailableError, ProvenanceError
from gateway.provenance.writer.events import FaultEvents

__all__ = ["Backlog"]


class Backlog:
    """Whether the log holds as many unsigned entries' bytes as it may (`held()`)."""

    def __init__(self, limit: int, held: Callable[[], int], events: FaultEvents | None) -> None:
        self._limit = limit
        self._held = held
        self._events = events
        self._error: ProvenanceError | None = None  # while past the bound, as reported

    @property
    def limit(self) -> int:
        return self._limit

    def current(self) -> ProvenanceError | None:
        """The error while the entries held reach the bound (reported once when it begins,
        and once when it ends); None below it."""
        held = self._held()
        if held < self._limit:
            if self._error is not None:
                self._error = None
                if self._events is not None:
                    self._events.info("provenance log backlog signed again", held_bytes=held)
            return None
        if self._error is None:
            self._error = LogUnavailableError(
                f"cannot append to the provenance log: {held} bytes of entries wait for a "
                f"signed checkpoint, the most it holds (provenance.max_unsigned_bytes, "
                f"{self._limit}); checkpoints are failing or slow"
            )
            if self._events is not None:
                self._events.error("provenance log backlog full", detail=str(self._error))
        return self._error
