"""Where the log writer reports a fault and its end: one line when writes (or checkpoints)
start failing, one when they work again, never one per failed request.

A structlog logger fits (the gateway passes `owngate.provenance`). The lines carry the
error's text: an OS error's reason and the log's own file names, never request content.

A line is best effort: the disk that refuses the log may hold the process's stderr too, and
a reporter that raises (EFBIG, ENOSPC, a closed stream) must not stop the writer half way
through a failure, with refused appenders never told and the fault never shown.
`Reported` wraps the reporter the writer is given so that it never raises.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

__all__ = ["FaultEvents", "Reported"]


class FaultEvents(Protocol):
    """The two levels the writer reports at."""

    def error(self, event: str, **fields: Any) -> Any: ...

    def info(self, event: str, **fields: Any) -> Any: ...


class Reported:
    """`events`, whose lines are written if they can be: an exception from writing one is
    swallowed (the fault it reports still shows in readiness and metrics)."""

    __slots__ = ("_events",)

    def __init__(self, events: FaultEvents) -> None:
        self._events = events

    def error(self, event: str, **fields: Any) -> None:
        with contextlib.suppress(Exception):  # a line that cannot be written is lost, no more
            self._events.error(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        with contextlib.suppress(Exception):  # a line that cannot be written is lost, no more
            self._events.info(event, **fields)
