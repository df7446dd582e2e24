"""One complete request as the sidecar's listener read it (`RequestReader`, reader.py),
handed whole to what answers it (`gateway/attest/protocol.py`), and which of its header
fields the relay passes on to the inference server (`forwarded`)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from gateway.body_budget import Held

__all__ = ["Request", "forwarded"]

# What reaches the backend as sent: the request's framing and credentials, no more.
_FORWARDED = frozenset({b"content-type", b"authorization", b"accept"})
# The trace context as a gateway sends it (gateway/tracing/spans.py `_traceparent`):
# version 00, lower-case hex, neither id all zeros; 55 bytes.
_TRACEPARENT = re.compile(rb"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def forwarded(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The header fields of a request that go on to the inference server: `_FORWARDED`
    as they came, and `traceparent` only when the request has exactly one, in the form a
    gateway sends (`_TRACEPARENT`). The sidecar also answers whoever reaches it without
    mutual TLS, and the server's tracing reads that field: several copies, a list, 7 KB of
    text or bytes no trace context has would otherwise reach it (and its logs) verbatim."""
    kept, traces = [], []
    for name, value in headers:
        if name in _FORWARDED:
            kept.append((name, value))
        elif name == b"traceparent":
            traces.append(value)
    if len(traces) == 1 and _TRACEPARENT.fullmatch(traces[0]):
        kept.append((b"traceparent", traces[0]))
    return kept


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
