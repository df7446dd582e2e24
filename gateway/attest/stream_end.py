"""What the sidecar writes after a stream's bytes, before its countersignature comment
(`StreamEnd`), relayed and hashed as part of the countersigned body.

The comment must start a line of its own: glued to a last line the backend left unended,
it would be that line's text (a `data:` line carrying the signature), so a line end goes
first. Then, after a stream whose events had `id` fields, an `id` field with no value:
the OpenAI Python SDK keeps the last event id for every later event and, while one is
set, dispatches an event at any blank line, whose `json()` of empty data raises. The
gateway's receipt line ends with a blank line, so after such a stream ended without
`[DONE]` (where the SDK would have stopped) the SDK raised at the end of an answer it had
read whole. The gateway clears the id with that same line of its own
(gateway/api/stream_relay.py `_id_reset`), but not on an attested backend's stream, whose
countersigned body must be the client's bytes: the sidecar writes it
(tests/integration/test_attest_event_ids.py).

An `id` line is looked for erring on the side of yes: any line that is `id` or starts
`id:` (a UTF-8 byte order mark before it too) counts, whatever event it is in or whether
`[DONE]` came first. The extra line is harmless where no id was kept: an `id` with no
value sets none, and an SDK stopped at `[DONE]` reads nothing after it. A line start split
across reads is kept (its line end and at most `_HEAD - 1` bytes after it), so the answer
does not depend on how the stream was cut; once one is seen, no more is searched.

It runs once per read of every attested stream: each read is searched with `bytes.find`
for a line end followed by `id` (and for a BOM followed by `id`), not with a regular
expression tried at every byte (three to four times as long on a read of whole events,
more than ten times on a read of line ends), and nothing of a long line is copied.
"""

from __future__ import annotations

from typing import Final

__all__ = ["StreamEnd"]

_ID_RESET: Final = b"id\n"  # an `id` field with no value: the SDK holds no id after it
_BOM: Final = b"\xef\xbb\xbf"
_BOM_ID: Final = _BOM + b"id"
_LINE_ID: Final = (b"\nid", b"\rid")  # `id` at a line start
_FIELD_END: Final = (b":", b"\r", b"\n")  # what ends the name `id` in an `id` line
_LINE_ENDS: Final = (b"\n", b"\r")
_STARTS: Final = b"i\xef"  # the first byte of `id`, of a BOM
_HEAD: Final = 6  # a line end, a BOM and `id`: a line start no longer is no `id` line


class StreamEnd:
    """Fed a stream's bytes as relayed, read by read; `after()` is what goes after them."""

    def __init__(self) -> None:
        self.ids = False  # a line of the stream was an `id` field
        self._last = b""  # the last byte relayed
        # The unfinished line with the line end before it (LF at the stream's start),
        # while it is short enough to become an `id` line; empty when it no longer can.
        self._head = b"\n"

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self._last = data[-1:]
        if self.ids:
            return
        head = self._head
        # An `id` line starting in `head` ends within `_HEAD + 1` bytes of its line end:
        # within `head` and data's first `_HEAD` bytes (a lone line end in `head`: only
        # if data starts `i` or a BOM); any other lies in `data` alone.
        if (
            head and (len(head) > 1 or data[0] in _STARTS) and _has_id(head + data[:_HEAD])
        ) or _has_id(data):
            self.ids = True
            return
        if self._last in _LINE_ENDS:  # (the usual read: whole events)
            self._head = self._last
            return
        last_end = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last_end >= 0:
            kept = len(data) - last_end
            self._head = data[last_end:] if kept <= _HEAD else b""
        else:  # (never a copy of a long read: a line this long is no `id` line)
            kept = len(head) + len(data) if head else _HEAD + 1
            self._head = head + data if kept <= _HEAD else b""

    def after(self) -> bytes:
        """A line end if the stream's last line is unended, then the `id` line if due."""
        line_end = b"\n" if self._last and self._last not in b"\r\n" else b""
        # (a last line `id`, unended: the line end ends it)
        last_id = self._head[1:].removeprefix(_BOM) == b"id"
        return line_end + (_ID_RESET if self.ids or last_id else b"")


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
        if text[at - 1] in (10, 13) and text[at + 5 : at + 6] in _FIELD_END:
            return True
        at = text.find(_BOM_ID, at + 5)
    return False
