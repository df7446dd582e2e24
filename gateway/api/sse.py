"""Watching an OpenAI SSE stream as it is relayed: its end, its usage, its usage chunk.

A private backend's stream is relayed byte for byte; `StreamWatch.feed` returns what to
send on. It notes whether `data: [DONE]` arrived at the start of a line (a stream whose
body ends with the connection, without framing, is complete only then: an EOF before it
is a backend that died) and the token usage the backend reported. Lines end in LF, CRLF
or a bare CR, as the SSE grammar allows, in every mode (a CRLF split across reads
included), and `data:[DONE]` without the space ends a stream as it does for an SSE
parser. When the gateway asked the backend for usage the client did not ask for
(`stream_options.include_usage`), it also holds back the usage-only chunk
(`"choices": []` and a `usage` object, as OpenAI sends it): the client gets the stream
it asked for, the gateway gets the counts. Only then are lines buffered, and a partial
line only up to `max_line` bytes (a usage chunk is a few hundred bytes: a longer line is
passed on as it comes). When the client asked for usage itself, nothing
is held back, but the counts of each `data:` line holding `"usage"` are still noted
(lines ending in LF, CRLF or CR, `data:` with or without its space), wherever it comes in
the stream: the completion record states what the client was shown.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from gateway.upstream.openai_wire import usage_of

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
_SPLIT: Final = len(_USAGE) - 1  # bytes on either side of a read boundary `"usage"` may cross
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
        self.usage: dict[str, int] | None = None  # the last counts reported
        self._max_line = max_line
        self._edge = _NL  # the last bytes seen, to find `[DONE]` split across reads
        self._pending = b""  # strip mode: the start of a line not yet complete
        self._passing = False  # strip mode: inside an over-long line, passed on as it comes
        self._drop_blank = False  # strip mode: the blank line ending a dropped event
        self._skip_lf = False  # strip mode: a dropped line ended in CR at a read's end
        # Not strip mode: the stream's unfinished last line, and whether it holds
        # `"usage"` (`_note_usage`).
        self._line = bytearray()
        self._hit = False

    def feed(self, data: bytes) -> bytes:
        """Bytes from the backend in; the bytes to relay out (possibly fewer, or none)."""
        if not self.strip_usage:
            if (
                # the usual read: whole lines after a read that ended one, none of them
                # holding usage (one search each, as in strip mode)
                self._edge is _NL
                and not self._line
                and data[-1:] in _ENDS  # (`endswith` parses its arguments)
                and data.find(_USAGE) < 0
            ):
                if self._seek and data.find(_DONE) >= 0 and _ends_stream(data, 0, len(data)):
                    self._found_done()  # (`data` starts a line)
                return data
            self._see_done(data)
            self._note_usage(data)
            return data
        if (
            # whole lines, none of them a usage chunk: nothing to hold back (the usual read)
            not self._pending
            and not self._passing
            and not self._drop_blank
            and not self._skip_lf
            and data[-1:] in _ENDS
            and data.find(_USAGE) < 0  # not `in`: see `_see_done`
        ):
            if self._seek and data.find(_DONE) >= 0 and _ends_stream(data, 0, len(data)):
                self._found_done()  # (`data` starts a line)
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
        """At the end of the stream: a last line that never got its newline, if any."""
        rest, self._pending = self._pending, b""
        if self._seek and rest and _ends_stream(rest, 0, len(rest)):
            self._found_done()
        if self._hit:  # not strip mode: a last usage line left open
            self._counts(bytes(self._line).rstrip(b"\r"))
        self._line.clear()
        self._hit = False
        return rest

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
            if self._seek and _ends_stream(line, 0, len(line)):
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
        if self._seek and _ends_stream(buffer, start, end):
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

    def _note_usage(self, data: bytes) -> None:
        """Not strip mode: note the counts of every complete line holding `"usage"`, the
        bytes passed on as they came. Only the unfinished last line is kept between
        reads (at most `max_line` bytes); a read is searched once, with the few bytes
        before it for a `"usage"` split across reads."""
        line = self._line
        if not line:
            if data.find(_USAGE) < 0:  # the usual read: nothing to parse
                if not data.endswith(_ENDS):
                    self._open(data, _line_start(data, len(data)))
                return
            self._scan(data)
        elif self._hit:  # the open line holds `"usage"`: wait for its end
            end = _line_end(data, 0)
            if end < 0:
                self._grow(data)
                return
            line += data[:end]
            self._counts(bytes(line).rstrip(b"\r\n"))
            line.clear()
            self._hit = False
            self._scan(data[end:])
        elif data.find(_USAGE) < 0 and (line[-_SPLIT:] + data[:_SPLIT]).find(_USAGE) < 0:
            if _line_end(data, 0) < 0:  # the open line goes on
                self._grow(data)
                return
            line.clear()  # it ended, holding no usage
            if not data.endswith(_ENDS):
                self._open(data, _line_start(data, len(data)))
        else:
            joined = bytes(line) + data
            line.clear()
            self._scan(joined)

    def _scan(self, data: bytes) -> None:
        """No line open: note the counts of `data`'s complete lines holding `"usage"`,
        and keep its unfinished last line open."""
        start = 0
        while True:
            hit = data.find(_USAGE, start)
            if hit < 0:
                break
            begin, end = _line_start(data, hit, start), _line_end(data, hit)
            if end < 0:
                self._open(data, begin, hit=True)
                return
            self._counts(data[begin:end].rstrip(b"\r\n"))
            start = end
        rest = _line_start(data, len(data), start)
        if rest < len(data):
            self._open(data, rest)

    def _open(self, data: bytes, start: int, *, hit: bool = False) -> None:
        """Keep `data[start:]` as the open line (none is open), if not over `max_line`."""
        if len(data) - start <= self._max_line:
            self._line += data[start:]
            self._hit = hit

    def _grow(self, data: bytes) -> None:
        """The open line goes on with all of `data`; past `max_line` it is let go (no
        usage chunk is that long)."""
        self._line += data
        if len(self._line) > self._max_line:
            self._line.clear()
            self._hit = False

    def _counts(self, line: bytes) -> dict[str, Any] | None:
        """The event of a `data:` line holding a usage object with counts, whose counts
        it notes (`usage`); None for any other line."""
        if not line.startswith(b"data:"):
            return None
        try:
            doc = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(doc, dict):
            return None
        counts = usage_of(doc.get("usage"))
        if counts is None:
            return None
        self.usage = counts
        return doc

    def _usage_only(self, line: bytes) -> bool:
        """Whether `line` is a usage-only chunk (its counts are kept either way)."""
        doc = self._counts(line)
        return doc is not None and doc.get("choices") == []


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
