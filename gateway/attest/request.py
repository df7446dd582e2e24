"""One complete request as the sidecar's listener read it (`RequestReader`, reader.py),
handed whole to what answers it (`gateway/attest/protocol.py`)."""

from __future__ import annotations

from gateway.body_budget import Held

__all__ = ["Request"]


class Request:
    """One complete request: method, target (path and query), headers (names in lower
    case, in order), body, whether the connection stays open after it, its share of
    the listener's `BodyBudget` (released by whoever answers it), and whether it is
    HTTP/1.0 (its client knows no chunked framing)."""

    __slots__ = ("body", "headers", "held", "http10", "keep_alive", "method", "target")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        keep_alive: bool,
        held: Held | None = None,
        http10: bool = False,
    ) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.held = held
        self.http10 = http10
