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
across reads is kept (under `_HEAD` bytes), so the answer does not depend on how the
stream was cut; once one is seen, no more is searched.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["StreamEnd"]

_ID_RESET: Final = b"id\n"  # an `id` field with no value: the SDK holds no id after it
_ID: Final = re.compile(rb"(?:\A|[\r\n])(?:\xef\xbb\xbf)?id[:\r\n]")
_LINE_END: Final = re.compile(rb"[\r\n]")
_BOM: Final = b"\xef\xbb\xbf"
_HEAD: Final = 6  # a BOM, `id` and `:`: a line start shorter may still become one


class StreamEnd:
    """Fed a stream's bytes as relayed, read by read; `after()` is what goes after them."""

    def __init__(self) -> None:
        self.ids = False  # a line of the stream was an `id` field
        self._last = b""  # the last byte relayed
        self._head = b""  # the unfinished line, while it is short enough to become one
        self._at_start = True  # whether `_head` (the next read when empty) starts a line

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self._last = data[-1:]
        if self.ids:
            return
        text = self._head + data
        start = 0 if self._at_start else _first_line_end(text)
        if start is not None and _ID.search(text, start) is not None:
            self.ids = True
            return
        last_end = max(text.rfind(b"\n"), text.rfind(b"\r"))
        rest = text[last_end + 1 :]
        self._at_start = (last_end >= 0 or self._at_start) and len(rest) < _HEAD
        self._head = rest if self._at_start else b""

    def after(self) -> bytes:
        """A line end if the stream's last line is unended, then the `id` line if due."""
        line_end = b"\n" if self._last and self._last not in b"\r\n" else b""
        # (a last line `id`, unended: the line end ends it)
        last_id = self._at_start and self._head.removeprefix(_BOM) == b"id"
        return line_end + (_ID_RESET if self.ids or last_id else b"")


def _first_line_end(text: bytes) -> int | None:
    """Where `text`'s first line end is (a match from there is at a line start), or None."""
    found = _LINE_END.search(text)
    return None if found is None else found.start()
