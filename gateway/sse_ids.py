"""Whether a stream's lines held an SSE `id` field (`IdLines`), however it was cut into
reads: for the empty `id` line written before the receipt line, by the `owngate attest`
sidecar (gateway/attest/stream_end.py) and by the gateway's reader where it lets an event
go unread (gateway/api/sse_events.py).

A line counts that is `id` or starts `id:` (a UTF-8 byte order mark before it too),
erring on the side of yes: the OpenAI SDK keeps such an id for every later event (not
one after a BOM: the extra line is harmless there). Lines end at LF, CR or CRLF. A line
start split across reads is kept (its line end and at most `_HEAD - 1` bytes after it);
once one is seen, no more is searched. Each read is searched with `bytes.find` for a line
end followed by `id` (and for a BOM followed by `id`), not with a regular expression
tried at every byte (three to four times as long on a read of whole events, more than ten
times on a read of line ends), and nothing of a long line is copied.
"""

from __future__ import annotations

from typing import Final

__all__ = ["IdLines"]

_BOM: Final = b"\xef\xbb\xbf"
_BOM_ID: Final = _BOM + b"id"
_LINE_ID: Final = (b"\nid", b"\rid")  # `id` at a line start
_FIELD_END: Final = (b":", b"\r", b"\n")  # what ends the name `id` in an `id` line
_LINE_ENDS: Final = (10, 13)
_STARTS: Final = b"i\xef"  # the first byte of `id`, of a BOM
_HEAD: Final = 6  # a line end, a BOM and `id`: a line start no longer is no `id` line


class IdLines:
    """Fed a stream's bytes from a line start, read by read: `seen` once a line was an
    `id` field (an unended last line `id` aside: `unended_id`)."""

    def __init__(self) -> None:
        self.seen = False
        # The unfinished line with the line end before it (an LF at the start), while it
        # is short enough to become an `id` line; empty when it no longer can.
        self._head = b"\n"

    def feed(self, data: bytes) -> None:
        if self.seen or not data:
            return
        head = self._head
        # An `id` line starting in `head` ends within `_HEAD + 1` bytes of its line end:
        # within `head` and data's first `_HEAD` bytes (a lone line end in `head`: only
        # if data starts `i` or a BOM); any other lies in `data` alone.
        if (
            head and (len(head) > 1 or data[0] in _STARTS) and _has_id(head + data[:_HEAD])
        ) or _has_id(data):
            self.seen = True
            return
        if data[-1] in _LINE_ENDS:  # (the usual read: whole events)
            self._head = data[-1:]
            return
        last_end = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last_end >= 0:
            kept = len(data) - last_end
            self._head = data[last_end:] if kept <= _HEAD else b""
        else:  # (never a copy of a long read: a line this long is no `id` line)
            kept = len(head) + len(data) if head else _HEAD + 1
            self._head = head + data if kept <= _HEAD else b""

    @property
    def unended_id(self) -> bool:
        """Whether the last line, unended, is `id` (the line end written after it ends it)."""
        return self._head[1:].removeprefix(_BOM) == b"id"


def _has_id(text: bytes) -> bool:
    """Whether `text` holds a line end, then `id` (a BOM before it too) and a `:` or a
    line end."""
    for needle in _LINE_ID:
        at = text.find(needle)
        while at >= 0:
            if text[at + 3 : at + 4] in _FIELD_END:
                return True
            at = text.find(needle, at + 3)
    at = text.find(_BOM_ID, 1)
    while at >= 0:
        if text[at - 1] in _LINE_ENDS and text[at + 5 : at + 6] in _FIELD_END:
            return True
        at = text.find(_BOM_ID, at + 5)
    return False
