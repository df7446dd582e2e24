"""Where the log writer reports a fault and its end: one line when writes (or checkpoints)
start failing, one when they work again, never one per failed request.

A structlog logger fits (the gateway passes `owngate.provenance`). The lines carry the
error's text: an OS error's reason and the log's own file names, never request content.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["FaultEvents"]


class FaultEvents(Protocol):
    """The two levels the writer reports at."""

    def error(self, event: str, **fields: Any) -> Any: ...

    def info(self, event: str, **fields: Any) -> Any: ...
