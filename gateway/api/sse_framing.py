"""Where an SSE stream's lines and events end in relayed bytes: the blank line that ends
an event (LF, CR or CRLF line ends, in any mix), found with byte searches, and the one
read shape a paced server writes (`one_data_line`). What the events hold is read by
`sse_events.EventReader`; `sse.StreamWatch` finds a stream's end and usage chunk with
these."""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "BLANK",
    "BLANK_TAILS",
    "LF",
    "LINE_END_BYTES",
    "event_end",
    "last_event_end",
    "one_data_line",
    "past_blank",
]

# Two line ends in a row: a blank line (its own end may be the CR of a CRLF).
BLANK: Final = re.compile(rb"\n\n|\r\r|\n\r")
LF: Final = 10
_CR: Final = 13
# A read ending with a blank line ends in one of these, or in CRLF after a line end.
BLANK_TAILS: Final = (b"\n\n", b"\r\r", b"\n\r")
LINE_END_BYTES: Final = (b"\n", b"\r")


def one_data_line(data: bytes) -> bool:
    """Whether `data` is one line `data: {...` and the blank line that ends its event, LF
    each, nothing else: a paced server's usual read (one token per write). Its one line is
    no comment (no `owngate-` comment to remove), no field but `data` (none that dispatches
    an event without data) and its value starts `{` (not `[DONE]`): what four searches of
    the read per filter otherwise rule out, told by two `memchr`s (one-byte `find`s)."""
    return (
        data[:7] == b"data: {"
        and data.find(b"\n") == len(data) - 2
        and data[-1] == LF
        and data.find(b"\r") < 0
    )


def past_blank(data: bytes, at: int) -> int:
    """Past the blank line whose two line ends start at `at` (`BLANK`)."""
    end = at + 2
    return end + 1 if data[at + 1] == _CR and data[end : end + 1] == b"\n" else end


def last_event_end(data: bytes, start: int = 0, end: int | None = None) -> int:
    """Where the last blank line in `data[start:end]` ends (`start` when there is none;
    `start` begins a line)."""
    if end is None:
        end = len(data)
    at = data.rfind(b"\n\n", start, end)
    # A blank line of CRs ends later only with a CR after `at`: looked for with `memrchr`
    # (a one-byte `rfind`), not with two backward searches over the whole read, which on
    # a coalesced stream (most servers end lines with LF alone) were a fifth of its cost.
    after = max(start, at + 1)
    if data.rfind(b"\r", after, end) >= 0:
        at = max(at, data.rfind(b"\r\r", after, end), data.rfind(b"\n\r", after, end))
    return past_blank(data, at) if at >= 0 else start


def event_end(data: bytes, start: int) -> int:
    """Where the event starting at `start` ends, after its blank line (the LF of a CRLF
    included when it is there); -1 while it has not ended."""
    found = BLANK.search(data, start)
    return past_blank(data, found.start()) if found is not None else -1
