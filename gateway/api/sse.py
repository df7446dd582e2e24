"""Watching an OpenAI SSE stream as it is relayed: its end, its usage, its usage chunk.

A private backend's stream is relayed byte for byte; `StreamWatch.feed` returns what to
send on. It notes whether `data: [DONE]` arrived at the start of a line (a stream whose
body ends with the connection, without framing, is complete only then: an EOF before it
is a backend that died). Lines end in LF, CRLF or a bare CR, as the SSE grammar allows,
in every mode (a CRLF split across reads included), and `data:[DONE]` without the space
ends a stream as it does for an SSE parser. When the gateway asked the backend for usage
the client did not ask for (`stream_options.include_usage`), it also holds back the
usage-only chunk (an event whose `data:` lines join to `"choices": []` and a `usage`
object, as OpenAI sends it): the client gets the stream it asked for, the gateway gets
the counts. The whole event is held back, its `event:`, `id:` and comment lines too:
one left behind would join the next event the client reads (which its SDK would then
read under the held-back event's name). Only then are events buffered, an unfinished
one until its blank line (no SSE client dispatches it before) and only up to
`max_line` bytes (a usage chunk is a few hundred bytes: a longer event is passed on as
it comes).

What is relayed is read as the client's SDK reads it (gateway/api/sse_events.py): the
completion record states the usage the client was shown (else the counts of a chunk held
back from it) and whether the backend's own error event reached it.
"""

from __future__ import annotations

import re
from typing import Final

from gateway.api.sse_events import EventReader
from gateway.api.sse_framing import BLANK_TAILS, LINE_END_BYTES, event_end, last_event_end
from gateway.api.usage_read import counts_in, read_json

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
_LINE_ENDS: Final = re.compile(rb"\r\n|\r|\n")


class StreamWatch:
    """One relayed stream's watcher; `strip_usage`: hold back the usage-only chunk;
    `find_done`: look for `data: [DONE]` (`done`): a body that ends with its connection
    needs it (its end is no proof it is complete), and the relay of any body reads a
    failure after it as the stream's end, the client having read it whole."""

    def __init__(
        self, *, strip_usage: bool, find_done: bool = True, max_line: int = _MAX_LINE
    ) -> None:
        self.strip_usage = strip_usage
        # `data: [DONE]` arrived at the start of a line (with `find_done`; else never set)
        self.done = False
        # the event the client's SDK stops at (`events.done`, or the backend's error
        # event it raises) went to its connection, the kernel took it (set by the relay,
        # gateway/api/stream_relay.py `_sent`)
        self.sent_done = False
        self._seek = find_done  # `find_done` and not `done` yet
        # strip mode: a `[DONE]` line was passed on in a read holding `"usage"` (one in a
        # read without it, the event reader saw): a usage chunk after it is not held
        self._after_done = False
        self._max_line = max_line
        self._edge = _NL  # the last bytes seen, to find `[DONE]` split across reads
        self._pending = b""  # strip mode: the event not yet complete, from its start
        self._passing = False  # strip mode: inside an over-long event, passed on as it comes
        # Strip mode, passing: the last bytes passed (a blank line's first, a `[DONE]`
        # line's start), none of them the end of an event.
        self._carry = b""
        # Strip mode: the bytes went out up to a CR that may be the first half of a CRLF,
        # the LF of which then starts the next read: of a dropped event (`_skip_lf`: drop
        # it too) or of what went on (`_pass_lf`: pass it, not taken for an empty line
        # that starts the next event).
        self._skip_lf = False
        self._pass_lf = False
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

    def feed(self, data: bytes, one_line: bool = False) -> bytes:
        """Bytes from the backend in; the bytes to relay out (possibly fewer, or none).
        `one_line`: `data` is `sse_framing.one_data_line` (the caller tested it). An empty
        read (a read that was all a stripped comment, the relay's flushes at the end)
        changes nothing: in strip mode it once went through `_events` whole and cleared
        the note that the next read's LF ends a held-back event's CRLF."""
        if not data:
            return data
        if self.strip_usage:
            if (  # whole events, none of them a usage chunk: nothing to hold back
                not self._pending
                and not self._passing
                and not self._skip_lf
                and not self._pass_lf
                and data.find(_USAGE) < 0  # not `in`: see `_see_done`
                and (  # it ends with a blank line (as EventReader.feed tests it)
                    one_line
                    or (tail := data[-2:]) in BLANK_TAILS
                    or (tail == b"\r\n" and data[-3:-2] in LINE_END_BYTES)
                )
            ):  # the usual read
                self._pass_lf = data[-1] == _CR
                # (one data line starts `{`: no `[DONE]`, not searched)
                if (
                    self._seek
                    and not one_line
                    and data.find(_DONE) >= 0
                    and _ends_stream(data, 0, len(data))
                ):
                    self._found_done()  # (`data` starts a line)
                # Tested here already, whole events and no `"usage"` are not tested again;
                # one data line is parsed (`EventReader.feed`).
                if one_line:
                    self.events.feed(data, True)
                else:
                    self.events.feed(data)
                return data
            return self._events(data)  # (it tells the event reader what goes on, as it goes)
        if self._edge is _NL and data[-1:] in _ENDS:  # whole lines after a read that ended
            # one, the usual read (`endswith` parses its arguments)
            if (
                self._seek
                and not one_line
                and data.find(_DONE) >= 0
                and _ends_stream(data, 0, len(data))
            ):
                self._found_done()  # (`data` starts a line)
        else:
            self._see_done(data)
        self.events.feed(data, one_line)
        return data

    def flush(self) -> bytes:
        """At the end of the stream: the last event, if it never got its blank line (to
        relay, unless it is a usage-only chunk; the client's reader then ends, `end`)."""
        rest, self._pending = self._pending, b""
        if rest and len(rest) <= self._max_line and self._usage_only(rest):
            rest = b""
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

    def _events(self, data: bytes) -> bytes:
        """Hold back usage-only events from `data`, each whole: every line of it (an
        `event:`, `id:` or comment line before its `data:` line too) through the blank
        line that ends it, so nothing of it is left to join the next event.

        An event is held until its blank line (no SSE client dispatches it before), up to
        `max_line` bytes; only an event that contains `"usage"` is parsed: the runs of
        whole events between such events are passed on as they are, checked for `[DONE]`
        at a line start, so a read of many events (a fast server's stream coalesced by
        TCP) costs a few searches, not a Python step per line or event."""
        buffer = self._pending + data if self._pending else data
        self._pending = b""
        kept: list[bytes] = []
        start = 0
        if buffer[:1] == b"\n" and (self._skip_lf or self._pass_lf):
            if self._pass_lf:  # the LF of the CRLF that ended what went on: it goes too
                kept.append(b"\n")
            start = 1
        self._skip_lf = self._pass_lf = False
        if self._passing:
            start = self._let_through(buffer, start, kept)
            if self._passing:
                self._tell(kept, 0)
                return b"".join(kept)
        told = 0  # what of `kept` the event reader has read
        while True:
            start = self._past_empty(buffer, start, kept)
            hit = buffer.find(_USAGE, start)
            if hit < 0:  # none in the rest: its whole events go on
                begin = last_event_end(buffer, start)
                self._pass(buffer, start, begin, kept)
                start = begin
                break
            begin = last_event_end(buffer, start, hit)  # where the event holding it starts
            self._pass(buffer, start, begin, kept)
            start = begin
            end = event_end(buffer, begin)
            if end < 0:  # that event is not complete yet: hold it
                break
            # what went on before it first: a `[DONE]` or an error event there stops the
            # client's reading, whatever the reads' cuts (`_usage_only`)
            told = self._tell(kept, told)
            if end - begin <= self._max_line and self._usage_only(buffer[begin:end]):
                self._skip_lf = end == len(buffer) and buffer[-1] == _CR
            else:
                self._pass(buffer, begin, end, kept)
            start = end
        rest = buffer[start:]
        if len(rest) > self._max_line:  # no usage chunk is that long: let it go
            self._pass(buffer, start, len(buffer), kept)
            self._passing, self._carry, self._pass_lf = True, rest[-_EDGE:], False
            rest = b""
        self._pending = rest
        self._tell(kept, told)
        return b"".join(kept)

    def _tell(self, kept: list[bytes], told: int) -> int:
        """Feed the event reader `kept[told:]`; returns how much of `kept` it has read."""
        for part in kept[told:]:
            self.events.feed(part)
        return len(kept)

    def _past_empty(self, buffer: bytes, start: int, kept: list[bytes]) -> int:
        """Pass on the empty lines at `start` (an event's start: each is a blank line of
        its own, which ends no event of the backend's); where the next line starts."""
        end = start
        while end < len(buffer) and buffer[end] in (_LF, _CR):
            end += 2 if buffer[end] == _CR and buffer[end + 1 : end + 2] == b"\n" else 1
        if end > start:
            kept.append(buffer[start:end])
            self._pass_lf = end == len(buffer) and buffer[-1] == _CR
        return end

    def _let_through(self, buffer: bytes, start: int, kept: list[bytes]) -> int:
        """Inside an event let go past `max_line`: pass it on up to the blank line that
        ends it (found with the last bytes passed before: `_carry`; then `_passing` ends),
        or all of `buffer`; returns where what is left starts."""
        carry = self._carry
        search = carry + buffer[start:]
        found = event_end(search, 0)
        upto = len(search) if found < 0 else found
        if (self._seek or not self._after_done) and _ends_stream(search, 0, upto, line_start=False):
            self._passed_done()
        end = start + upto - len(carry)
        if end > start:
            kept.append(buffer[start:end])
            self._carry = search[:upto][-_EDGE:]
        if found >= 0:
            self._passing = False
            self._pass_lf = end == len(buffer) and buffer[-1] == _CR
        return end

    def _passed_done(self) -> None:
        """Strip mode: a `[DONE]` line went on."""
        self._after_done = True
        if self._seek:
            self._found_done()

    def _pass(self, buffer: bytes, start: int, end: int, kept: list[bytes]) -> None:
        """Pass on the whole lines `buffer[start:end]` (`start` begins a line)."""
        if end <= start:
            return
        if (self._seek or not self._after_done) and _ends_stream(buffer, start, end):
            self._passed_done()
        kept.append(buffer[start:end])
        self._pass_lf = end == len(buffer) and buffer[-1] == _CR

    def _usage_only(self, event: bytes) -> bool:
        """Whether `event` is a usage-only chunk (its `data:` lines joined and read as the
        client's parser reads them, gateway/api/sse_events.py, gateway/api/usage_read.py),
        held back: its counts are noted unless `[DONE]` came before."""
        if event.find(_USAGE) < 0:
            return False
        fields = [
            (name, value[1:] if value[:1] == b" " else value)
            for name, _, value in (line.partition(b":") for line in _LINE_ENDS.split(event))
        ]
        names = [value for name, value in fields if name == b"event"]
        if names and names[-1].startswith(b"thread."):
            return False  # the SDK hands it on nested, reading no usage from it: it goes on
        data = [value for name, value in fields if name == b"data"]
        if not data:
            return False
        joined = b"\n".join(data)
        try:
            doc = read_json(joined, line=True)
        except ValueError:
            return False
        if not isinstance(doc, dict) or doc.get("choices") != []:
            return False
        counts = counts_in(doc, joined)
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
