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

An `id` line is looked for erring on the side of yes (gateway/sse_ids.py `IdLines`: a
line that is `id` or starts `id:`, whatever event it is in or whether `[DONE]` came
first, however the stream was cut into reads). The extra line is harmless where no id was
kept: an `id` with no value sets none, and an SDK stopped at `[DONE]` reads nothing after
it. It runs once per read of every attested stream (`IdLines` searches with `bytes.find`).
"""

from __future__ import annotations

from typing import Final

from gateway.sse_ids import IdLines

__all__ = ["StreamEnd"]

_ID_RESET: Final = b"id\n"  # an `id` field with no value: the SDK holds no id after it


class StreamEnd:
    """Fed a stream's bytes as relayed, read by read; `after()` is what goes after them."""

    def __init__(self) -> None:
        self._lines = IdLines()
        self._last = b""  # the last byte relayed

    @property
    def ids(self) -> bool:
        """Whether a line of the stream was an `id` field."""
        return self._lines.seen

    def feed(self, data: bytes) -> None:
        if data:
            self._last = data[-1:]
            self._lines.feed(data)

    def after(self) -> bytes:
        """A line end if the stream's last line is unended, then the `id` line if due."""
        line_end = b"\n" if self._last and self._last not in b"\r\n" else b""
        due = self._lines.seen or self._lines.unended_id  # (the line end ends that one)
        return line_end + (_ID_RESET if due else b"")
