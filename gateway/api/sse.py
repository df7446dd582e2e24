"""Watching an OpenAI SSE stream as it is relayed: its end, its usage, its usage chunk.

A private backend's stream is relayed byte for byte; `StreamWatch.feed` returns what to
send on. It notes whether `data: [DONE]` arrived at the start of a line (a stream whose
body ends with the connection, without framing, is complete only then: an EOF before it
is a backend that died). Lines end in LF, CRLF or a bare CR, as the SSE grammar allows,
in every mode (a CRLF split across reads included), and `data:[DONE]` without the space
ends a stream as it does for an SSE parser. When the gateway asked the backend for usage
the client did not ask for (`stream_options.include_usage`), it also holds back the
usage-only chunk (`"choices": []` and a `usage` object, as OpenAI sends it, on one
`data:` line): the client gets the stream it asked for, the gateway gets the counts.
Only then are lines buffered, and a partial line only up to `max_line` bytes (a usage
chunk is a few hundred bytes: a longer line is passed on as it comes).

What is relayed is read as the client's SDK reads it (gateway/api/sse_events.py): the
completion record states the usage the client was shown (else the counts of a chunk held
back from it) and whether the backend's own error event reached it.
"""

from __future__ import annotations

from typing import Final

from gateway.api.sse_events import EventReader
from gateway.api.usage_read import counts_of, read_json

__all__ = ["StreamWatch"]

# How vLLM, SGLang and llama.cpp end a stream: a `data:` line (its one space optional,
# as for any SSE parser) whose value starts `[DONE]`, as the OpenAI SDKs test it; at the
# start of a line (after LF or CR: a raw line end is never inside a JSON string).
_DONE: Final = b"[DONE]"
_FIELD: Final = b"data:"
_EDGE: Final = len(b"\ndata: [DONE]") - 1  # bytes kept to find a marker split across reads
_LF: Final = 10
_CR: Final = 13
_MAX_LINE: Final = 64 * 1024
_USAGE: Final = b'"usage"'
_ENDS: Final = (b"\n", b"\r")
_NL: Final = b"\n"  # `_edge` after a read that ended a line: the next one starts a line


class StreamWatch:
    """One relayed stream's watcher; `strip_usage`: hold back the usage-only chunk;
    `find_done`: look for `data: [DONE]` (`done`), which only a body that ends with its
    connection needs (its end is no proof it is complete): a framed body says where it
    ends, and the relay would search every read for nothing."""

    def __init__(
        self, *, strip_usage: bool, find_done: bool = True, max_line: int = _MAX_LINE
    ) -> None:
        self.strip_usage = strip_usage
        # `data: [DONE]` arrived at the start of a line (with `find_done`; else never set)
        self.done = False
        self._seek = find_done  # `find_done` and not `done` yet
        # strip mode: a `[DONE]` line was passed on in a read holding `"usage"` (one in a
        # read without it, the event reader saw): a usage chunk after it is not held
        self._after_done = False
        self._max_line = max_line
        self._edge = _NL  # the last bytes seen, to find `[DONE]` split across reads
        self._pending = b""  # strip mode: the start of a line not yet complete
        self._passing = False  # strip mode: inside an over-long line, passed on as it comes
        self._drop_blank = False  # strip mode: the blank line ending a dropped event
        self._skip_lf = False  # strip mode: a dropped line ended in CR at a read's end
        self._held: dict[str, int] | None = None  # strip mode: a held-back chunk's counts
        # What the client reads of the relayed bytes (an event kept up to `max_line`).
        self.events = EventReader(max_event=max_line)

    @property
    def usage(self) -> dict[str, int] | None:
        """The counts to record: the last usage the client was shown, else the last of a
        usage-only chunk held back from it; none when what the client was shown last may
        hold a usage the gateway did not read (`EventReader.unknown`)."""
        shown = self.events.usage
        return shown if shown is not None or self.events.unknown else self._held

    @property
    def error_event(self) -> bool:
        """Whether the client read an error event of the backend's (its SDK raised it)."""
        return self.events.error_event

    def feed(self, data: bytes) -> bytes:
        """Bytes from the backend in; the bytes to relay out (possibly fewer, or none)."""
        if self.strip_usage:
            # whole lines, none of them a usage chunk: nothing to hold back
            usual = (
                not self._pending
                and not self._passing
                and not self._drop_blank
                and not self._skip_lf
                and data[-1:] in _ENDS  # (`endswith` parses its arguments)
                and data.find(_USAGE) < 0  # not `in`: see `_see_done`
            )
        else:  # whole lines after a read that ended one
            usual = self._edge is _NL and data[-1:] in _ENDS
        if usual:  # the usual read, inline (`_feed`)
            if self._seek and data.find(_DONE) >= 0 and _ends_stream(data, 0, len(data)):
                self._found_done()  # (`data` starts a line)
            self.events.feed(data)
            return data
        out = self._feed(data)
        self.events.feed(out)
        return out

    def _feed(self, data: bytes) -> bytes:
        """`feed` past the usual read (`feed` takes that one itself)."""
        if not self.strip_usage:
            self._see_done(data)
            return data
        if self._passing:
            end = _line_end(data, 0)
            if end < 0:
                return data
            self._passing = False
            head, data = data[:end], data[end:]
            return head + self._lines(data)
        return self._lines(data)

    def flush(self) -> bytes:
        """At the end of the stream: a last line that never got its newline, if any (to
        relay; the client's reader then ends, `end`)."""
        rest, self._pending = self._pending, b""
        if self._seek and rest and _ends_stream(rest, 0, len(rest)):
            self._found_done()
        self.events.feed(rest)
        return rest

    def end(self) -> None:
        """The relayed bytes ended (the gateway's own bytes, its receipt line or its error
        event, follow): the client's reader dispatches their unfinished last event."""
        self.events.finish()

    def _found_done(self) -> None:
        self.done = True
        self._seek = False

    def _see_done(self, data: bytes) -> None:
        if not self._seek:
            return
        # `find`, not `in`, once per relayed read: a bytes `in` first tries its operand as
        # an int (a TypeError raised and cleared), about 2x the instructions.
        if data.find(_DONE) >= 0 and _ends_stream(data, 0, len(data), line_start=False):
            self._found_done()
            return
        edge = self._edge + data[:_EDGE]  # a marker split across the previous read
        if edge.find(_DONE) >= 0 and _ends_stream(edge, 0, len(edge), line_start=False):
            self._found_done()  # (the usual read: no call)
        # After a line end only a marker that starts after it counts, and one before it
        # was seen already: `_NL` finds the same markers as the last bytes would.
        if data.endswith(_ENDS):
            self._edge = _NL
        else:
            self._edge = data[-_EDGE:] if len(data) >= _EDGE else edge[-_EDGE:]

    def _lines(self, data: bytes) -> bytes:
        """Hold back usage-only chunks (and the blank line ending each) from `data`.

        Only a line that contains `"usage"` is looked at: the runs of whole lines between
        such lines are passed on as they are, checked for `[DONE]` at a line start, so a
        read of many events (a fast server's stream coalesced by TCP) costs a few
        searches, not a Python step per line."""
        buffer = self._pending + data if self._pending else data
        kept: list[bytes] = []
        start = 0
        if self._skip_lf:  # the LF of a dropped line's CRLF, split from it by the read
            self._skip_lf = False
            start = 1 if buffer[:1] == b"\n" else 0
        if self._drop_blank:
            start = self._skip_blank(buffer, start)
        while True:
            hit = buffer.find(_USAGE, start)
            if hit < 0:  # none in the rest: its whole lines go on
                end = _line_start(buffer, len(buffer), start)
                self._pass(buffer, start, end, kept)
                start = end
                break
            line_start = _line_start(buffer, hit, start)
            line_end = _line_end(buffer, hit)
            if line_end < 0:  # that line is not complete yet: hold it
                self._pass(buffer, start, line_start, kept)
                start = line_start
                break
            line_end = self._past_lf(buffer, line_end)
            self._pass(buffer, start, line_start, kept)
            line = buffer[line_start:line_end]
            start = line_end
            if self._usage_only(line):
                self._drop_blank = True
                if not self._skip_lf:
                    start = self._skip_blank(buffer, start)
                continue
            self._skip_lf = False  # a kept line: its LF, if one follows, goes on too
            if (self._seek or not self._after_done) and _ends_stream(line, 0, len(line)):
                self._after_done = True
                if self._seek:
                    self._found_done()
            kept.append(line)
        rest = buffer[start:]
        if len(rest) > self._max_line:  # not a usage chunk: stop holding it back
            kept.append(rest)
            rest = b""
            self._passing = True
        self._pending = rest
        return b"".join(kept)

    def _pass(self, buffer: bytes, start: int, end: int, kept: list[bytes]) -> None:
        """Pass on the whole lines `buffer[start:end]` (`start` begins a line)."""
        if end <= start:
            return
        if (self._seek or not self._after_done) and _ends_stream(buffer, start, end):
            self._after_done = True
            if self._seek:
                self._found_done()
        kept.append(buffer[start:end])

    def _skip_blank(self, buffer: bytes, start: int) -> int:
        """After a held-back usage chunk: past the blank line that ends its event, once
        the next line is complete (whether blank or not, the wait for it ends)."""
        end = _line_end(buffer, start)
        if end < 0:
            return start
        self._drop_blank = False
        return self._past_lf(buffer, end) if end - start == 1 else start

    def _past_lf(self, buffer: bytes, end: int) -> int:
        """Past a line that ended at `end` (after its LF or CR): past the LF of a CRLF too,
        or, when the CR is the buffer's last byte, `_skip_lf` set (its LF may follow)."""
        if buffer[end - 1] == _CR:
            if end == len(buffer):
                self._skip_lf = True
            elif buffer[end] == _LF:
                return end + 1
        return end

    def _usage_only(self, line: bytes) -> bool:
        """Whether `line` is a usage-only `data:` line (read as the client's parser reads
        it, gateway/api/usage_read.py), held back: its counts are noted unless `[DONE]`
        came before."""
        if not line.startswith(b"data:"):
            return False
        try:
            doc = read_json(line[5:].rstrip(b"\r\n"), line=True)
        except ValueError:
            return False
        if not isinstance(doc, dict) or doc.get("choices") != []:
            return False
        counts = counts_of(doc.get("usage"))
        if counts is None:
            return False
        if not self.done and not self._after_done and not self.events.stopped:
            self._held = counts
        return True


def _ends_stream(data: bytes, start: int, end: int, *, line_start: bool = True) -> bool:
    """Whether `data[start:end]` holds a line that ends the stream (`data: [DONE]`,
    `data:[DONE]`) at the start of a line: after an LF or a CR in it, or at `start` when
    `line_start` (`start` begins a line)."""
    at = data.find(_DONE, start, end)
    while at >= 0:
        field = at - 6 if at > start and data[at - 1] == 32 else at - 5  # one space, or none
        if field >= start and data.startswith(_FIELD, field):
            if field > start and data[field - 1] in (_LF, _CR):
                return True
            if field == start and line_start:
                return True
        at = data.find(_DONE, at + 1, end)
    return False


def _line_start(data: bytes | bytearray, at: int, floor: int = 0) -> int:
    """Where the line holding `data[at]` begins: after the last line end (LF or CR) in
    `data[floor:at]`, or `floor`."""
    return max(data.rfind(b"\n", floor, at), data.rfind(b"\r", floor, at), floor - 1) + 1


def _line_end(data: bytes | bytearray, at: int) -> int:
    """Where the line holding `data[at]` ends (after its LF or CR; the LF of a CRLF then
    reads as a blank line, which holds no usage); -1 while it has not ended."""
    lf, cr = data.find(b"\n", at), data.find(b"\r", at)
    if lf < 0 and cr < 0:
        return -1
    return (lf if cr < 0 or 0 <= lf < cr else cr) + 1
