"""Reading a private backend's answer when nothing of it has reached the client yet: an
error body (for its message only) and the check that a whole answer is whole.

A backend is trusted to serve, not to be well-behaved: an error body is read up to
64 KiB and only by the attempt's first-byte deadline (one that trickles in must not hold
the failover past the request's deadline); a JSON answer whose body ended with the
connection (no length, not chunked) is whole only if it parses, as a backend that died
mid-answer closes the connection too.
"""

from __future__ import annotations

import orjson

from gateway.upstream.http import UpstreamError, UpstreamResponse

__all__ = ["MAX_ERROR_BODY", "check_whole", "read_error_body"]

MAX_ERROR_BODY = 64 * 1024  # its message is shown: plenty


async def read_error_body(response: UpstreamResponse, by: float) -> bytes:
    """An error answer's body, read by `by` (event-loop time) and within the whole
    answer's `response_timeout_s`; empty when too large, slow or broken (the status
    alone tells what happened then)."""
    deadline = response.response_deadline
    try:
        return await response.read(
            MAX_ERROR_BODY, deadline=by if deadline is None else min(by, deadline)
        )
    except UpstreamError:
        return b""


def check_whole(response: UpstreamResponse, data: bytes) -> None:
    """Raise `UpstreamError("closed")` when `data`, a JSON answer the close ended, does
    not parse: it was cut short (the caller fails over, as for a framed body that broke
    off)."""
    if not response.ended_by_close or not _is_json(response.header(b"content-type")):
        return
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError("closed", "the answer ended with the connection, cut short") from None


def _is_json(content_type: bytes | None) -> bool:
    """Whether an answer of `content_type` is JSON (none given: the relay's default)."""
    return content_type is None or b"json" in content_type.lower()
