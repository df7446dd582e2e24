"""Keeping a backend's `owngate-` SSE comments out of a relayed stream.

The gateway ends every stream it relays with its own comment line
`: owngate-receipt <base64>` (gateway/api/exchange.py); an attested backend's sidecar
ends its stream with `: owngate-attest <base64>`, which `SseTail` takes out first
(gateway/api/attested.py). A backend could write such lines itself, earlier in the
stream (another request's genuine receipt, a forged countersignature): `CommentFilter`
removes every one, so the only `owngate-` comment a client sees is the gateway's own.
The `owngate attest` sidecar runs the same filter over its inference server's stream
(gateway/attest/app.py), so what it countersigns is what the gateway relays.

What counts as one is what an SSE parser reads as a comment (the WHATWG event-stream
grammar): a line that starts with `:`, lines ending in LF, CRLF or CR, and the first
line possibly after a UTF-8 byte order mark (which a parser skips). Which line the client
gets first is not the filter's to know (removed lines, a usage chunk held back behind it
in gateway/api/sse.py): a line is read as if a BOM may open it wherever it comes (one
elsewhere is an unknown field to a parser, which it ignores, so removing it changes no
event). The line is removed, with its line ending, when the comment's text, after any
spaces and tabs, starts with `owngate-` in any ASCII case (`: owngate-receipt`,
`:owngate-attest`, `:\\t owngate-x`, `: OWNGATE-Receipt`: a client whose parser matches
the prefix without regard to case must not be handed a backend's line either). Any other
line, comments such as `: ping` included, passes untouched.

A line can be split across reads at any byte. The start of a line that may still become
such a comment (`:`, blanks, a prefix of `owngate-`) is held back until it can be told
apart, at most `_MAX_HELD` bytes: a comment whose leading blanks run past that is removed
too (it means nothing to an SSE client, and it could hide the prefix beyond the bound),
and so is one a read brings whole, so that the sidecar and the gateway, which read one
stream in different pieces, remove the same lines (before, a read ending inside it
removed it at the gateway alone: bytes other than the sidecar countersigned).
A removed line is dropped as it arrives, never buffered, however long it is.

The common read (no `owngate-` in it nor a run of 56 blanks, ending at a line end) costs
one `bytes.translate` (the ASCII case fold, a tab as a space), two `bytes.find` and a look
at its last byte; only reads with the marker or such a run, or ending mid-line, are
walked (a Python step per line that holds either or starts the read's last partial
line). A relay that found its read to be one `data:` line (gateway/api/sse_framing.py,
`one_data_line`) does not feed it while the filter is `clean`: it holds no comment line
and would pass unchanged.
"""

from __future__ import annotations

import asyncio
import re
from typing import Final

__all__ = ["CommentFilter", "without_comments", "without_comments_in_turns"]

_MARK: Final = b"owngate-"
_BOM: Final = b"\xef\xbb\xbf"
_MAX_HELD: Final = 64  # `:`, blanks, a prefix of `owngate-` (and a BOM at the start)
_LINE_END: Final = re.compile(rb"[\r\n]")
_BLANKS: Final = b" \t"
_ENDS: Final = (10, 13)  # LF, CR
# What decides is read case-folded (ASCII) with a tab as a space: a run of blanks that
# long after a line's `:` is one a read ending inside it could not hold (`_verdict`).
_FOLD: Final = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ\t", b"abcdefghijklmnopqrstuvwxyz ")
_RUN: Final = b" " * (_MAX_HELD - len(_MARK))
_OPENED: Final = (b":", _BOM + b":")  # a line the filter may remove or hold starts so
_LINE_OPENED: Final = (b"\n:", b"\r:", _BOM + b":")
_TURN_BYTES: Final = 16 * 1024  # what `without_comments_in_turns` walks between two turns


def without_comments(data: bytes) -> tuple[bytes, int]:
    """A whole answer less its `owngate-` comment lines, and how many were removed (what
    `without_comments_in_turns` returns, in one go: for tests and tools off the loop)."""
    if _untouched(data):
        return data, 0
    comments = CommentFilter()
    return comments.feed(data) + comments.flush(), comments.stripped


async def without_comments_in_turns(data: bytes) -> tuple[bytes, int]:
    """`without_comments(data)`, walked `_TURN_BYTES` at a time with a turn of the event
    loop between: the gateway's for the whole answer of a request that says `stream:
    true`, and the `owngate attest` sidecar's for every whole answer it countersigns, so
    that it signs what the gateway relays (it does not read the request's flag; nothing
    is left to remove then). The walk costs Python per removed line: in one go, a backend
    answering 16 MiB of `: owngate-x` lines held the loop 3.4 s (CPU time)."""
    if _untouched(data):
        return data, 0
    comments = CommentFilter()
    kept = []
    for start in range(0, len(data), _TURN_BYTES):
        if start:
            await asyncio.sleep(0)
        kept.append(comments.feed(data[start : start + _TURN_BYTES]))
    kept.append(comments.flush())
    return b"".join(kept), comments.stripped


def _untouched(data: bytes) -> bool:
    """Whether `without_comments` leaves `data` as it is, told without walking its lines.
    The usual answer: no line a `:` opens (after a BOM or not), and the filter removes or
    holds no other: nothing to remove, and no line walked (a regex search per line). One
    line (line ends at its end at most) is told by its start alone."""
    lines = data.rstrip(b"\r\n")
    if lines.find(b"\n") < 0 and lines.find(b"\r") < 0:
        return not lines.startswith(_OPENED)
    return not (data.startswith(b":") or any(data.find(start) >= 0 for start in _LINE_OPENED))


class CommentFilter:
    """One relayed stream's filter; `stripped` counts the lines it removed."""

    def __init__(self) -> None:
        self.stripped = 0
        self._held = b""  # the start of a line that may still be an `owngate-` comment
        self._line_start = True  # the next byte starts a line
        self._dropping = False  # inside a removed line whose end has not come yet
        self._skip_lf = False  # a removed line ended in CR at a read's end: its LF may follow
        # None of the above, after a first read: the usual read's state,
        # in which a read of whole lines none of which is a comment passes unchanged (and
        # leaves it so): a caller that knows its read is such (`sse_framing.one_data_line`)
        # need not feed it.
        self.clean = False

    def feed(self, data: bytes) -> bytes:
        """Bytes from the backend in; the bytes to relay out."""
        # Whole lines, none marked in any case nor holding a long run of blanks: the state
        # stays clean. `find`, not `in`: a bytes `in` first tries its operand as an int (a
        # raised and cleared TypeError).
        if self.clean and data and data[-1] in _ENDS:
            folded = data.translate(_FOLD)
            if folded.find(_MARK) < 0 and folded.find(_RUN) < 0:
                return data
        out = self._walk(data)
        self.clean = (
            self._line_start and not self._held and not self._dropping and not self._skip_lf
        )
        return out

    def flush(self) -> bytes:
        """At the end of the stream: a held line start that was not a removed comment (a
        removed one that never got its line end is gone)."""
        rest, self._held = self._held, b""
        if rest and _could_be_marked(rest):
            self.stripped += 1  # a comment start the stream ended inside: no client needs it
            return b""
        return rest

    def _walk(self, data: bytes) -> bytes:
        buffer = self._held + data if self._held else data
        self._held = b""
        folded = buffer.translate(_FOLD)  # what decides; the bytes relayed are `buffer`'s
        pos = 0
        if self._skip_lf and buffer:
            self._skip_lf = False
            if buffer[0] == 10:
                pos = 1
        if self._dropping:
            pos = self._past_line(buffer, pos)
            if self._dropping:
                return b""
        kept: list[bytes] = []
        while pos < len(buffer):
            start = pos
            at_start = self._line_start
            found = _LINE_END.search(buffer, pos)
            end = found.end() if found is not None else len(buffer)
            if at_start and buffer[pos] in b":\xef":
                verdict = _verdict(folded, pos, end)
                if verdict == "strip":
                    self.stripped += 1
                    self._dropping = True
                    pos = self._past_line(buffer, pos)
                    continue
                if verdict == "hold":  # only when no line end came yet
                    self._held = buffer[pos:]
                    break
            # A run of lines none of which can be removed: pass it on in one piece, up to
            # the next line that starts with a marker's first byte.
            pos = self._next_candidate(folded, end)
            kept.append(buffer[start:pos])
            self._line_start = buffer[pos - 1] in _ENDS
        return b"".join(kept)

    def _next_candidate(self, buffer: bytes, pos: int) -> int:
        """Past the whole lines from `pos` (a line start) that hold no `owngate-` at all
        nor a long run of blanks (`buffer` folded): the start of the line that holds the
        next one, or of the last, partial, line."""
        hit = buffer.find(_MARK, pos)
        run = buffer.find(_RUN, pos)
        if run >= 0 and (hit < 0 or run < hit):
            hit = run
        if hit < 0:  # the rest holds none: stop at the start of its last partial line
            if buffer[-1] in _ENDS:
                return len(buffer)
            last = max(buffer.rfind(b"\n", pos), buffer.rfind(b"\r", pos))
            return max(pos, last + 1)
        last = max(buffer.rfind(b"\n", pos, hit), buffer.rfind(b"\r", pos, hit))
        return max(pos, last + 1)

    def _past_line(self, buffer: bytes, pos: int) -> int:
        """Drop to the end of the removed line (its CRLF whole); `_dropping` stays set when
        the read ends first."""
        found = _LINE_END.search(buffer, pos)
        if found is None:
            self._line_start = False
            return len(buffer)
        self._dropping = False
        self._line_start = True
        end = found.end()
        if buffer[end - 1] == 13:  # CR: an LF right after belongs to it
            if end == len(buffer):
                self._skip_lf = True
            elif buffer[end] == 10:
                end += 1
        return end


def _verdict(buffer: bytes, pos: int, end: int) -> str:
    """Whether the line `buffer[pos:end]` (from a line start; `end` is past its line end,
    or the buffer's end when none came yet; `buffer` case-folded) is to be removed
    ("strip"), passed ("pass"), or cannot be told yet ("hold"). A BOM may open it: the
    client's first line may be any line (the module docstring)."""
    complete = end > pos and buffer[end - 1] in _ENDS
    line = buffer[pos:end]
    if line.startswith(_BOM):
        line = line[len(_BOM) :]
    if not complete and _BOM.startswith(line):
        return "hold"  # a BOM (or the start of one) and nothing after it yet
    if not line.startswith(b":"):
        return "pass"
    text = line[1:].lstrip(_BLANKS)
    if text.startswith(_MARK):
        return "strip"
    # Past the bound, what a read ending inside this line would hold (`:`, blanks, a start
    # of the marker): removed, whole or not, so that the verdict is the same however the
    # line came in reads (the sidecar and the gateway read a stream in different pieces).
    lead = len(line) - len(text)
    if lead + len(_MARK) > _MAX_HELD and lead + _common_start(text) > _MAX_HELD:
        return "strip"
    if complete or (text and not _MARK.startswith(text)):
        return "pass"
    return "hold"


def _common_start(text: bytes) -> int:
    """How many of `text`'s first bytes are the marker's."""
    count = 0
    for byte, mark in zip(text, _MARK, strict=False):
        if byte != mark:
            break
        count += 1
    return count


def _could_be_marked(rest: bytes) -> bool:
    """Whether a held line start, left at the end of the stream, is a comment that could
    have become an `owngate-` one (a bare `:` or blanks after it are not worth keeping:
    what the gateway writes next starts on a line of its own)."""
    line = rest[len(_BOM) :] if rest.startswith(_BOM) else rest
    return line.startswith(b":") and bool(line[1:].strip(_BLANKS))
