"""One SSE event's data as the client's SDK takes it, where `sse_events.EventReader` cannot
parse it within its bounds: whether `json.loads` refuses it for its text (`not_json`),
whether it may show a usage or an error at all (`may_show_usage`), and whether a `retry`
field's value is one `int()` reads (`retry_integer`: then it dispatches an event)."""

from __future__ import annotations

import json
import re
from typing import Final

__all__ = ["MAX_EVENT", "may_show_usage", "not_json", "retry_integer"]

# The most an unfinished event is kept (`EventReader`'s `max_event`), and past which
# `not_json` does not parse.
MAX_EVENT: Final = 64 * 1024
# What an event past the read bounds must hold to show a usage (`may_show_usage`): these, or
# `\u00` followed by 4-7 (an escaped ASCII letter may spell `usage` or `error`).
_NEEDLES: Final = (b'"usage"', b'"error"', b"[DONE]")
_ESCAPE: Final = b"\\u00"
_LETTER_ESCAPE: Final = re.compile(rb"\\u00[4-7]")


def not_json(data: bytes) -> bool:
    """Whether `json.loads` refuses `data` (a value past the read bounds, `PastBounds`)
    for its text, not its depth: a syntax error it meets before any recursion limit
    (`[` 600 times, then `x`), at which the client's parser raises whatever its stack.
    Bounded: not over `MAX_EVENT` bytes (some 30,000 arrays at most to build), and the
    recursion it refuses past stops it."""
    if len(data) > MAX_EVENT:
        return False
    try:
        json.loads(data.decode("utf-8"))
    except RecursionError:  # too deep for this stack: the client's may read it
        return False
    except ValueError:  # (UnicodeDecodeError is one)
        return True
    return False


def retry_integer(value: bytes) -> bool:
    """Whether the SDK's `int()` reads `value` (a `retry` field's: then it dispatches)."""
    try:
        int(value.decode())
    except ValueError:  # (UnicodeDecodeError is one)
        return False
    return True


def may_show_usage(data: bytes, start: int, end: int) -> bool:
    """Whether `data[start:end]` holds one of `_NEEDLES` or an escape `\\u0040` to
    `\\u007f` (a search each, no call for the usual read without a backslash)."""
    return (
        data.find(_NEEDLES[0], start, end) >= 0
        or data.find(_NEEDLES[1], start, end) >= 0
        or data.find(_NEEDLES[2], start, end) >= 0
        or _escape_at(data, start, end) >= 0
    )


def _escape_at(data: bytes, start: int, end: int) -> int:
    """Where the first escape `\\u0040` to `\\u007f` in `data[start:end]` starts; -1.
    A `find` first (a read without `\\u00` is the usual one), then the expression: not a
    Python step per other escape (a Go server writes each `<` as `\\u003c`)."""
    if data.find(_ESCAPE, start, end) < 0:
        return -1
    found = _LETTER_ESCAPE.search(data, start, end)
    return -1 if found is None else found.start()
