"""Reading a relayed SSE stream's events as the client's SDK reads them (`EventReader`):
the usage it was shown, and whether the backend's own error event reached it.

The OpenAI Python SDK (openai/_streaming.py, `SSEDecoder`; browsers' `EventSource` alike)
splits the body into lines at LF, CRLF or a bare CR, ignores comment lines (`:`), appends
each `data` field's value (after one optional space) to the event being read, and
dispatches the event at a blank line: its data is its `data` values joined with LF. It
stops at an event whose data starts `[DONE]`, and raises at one whose data is a JSON
object with a truthy `"error"` (an error event: nothing after it is read). A `usage`
object in any other event is shown to the client (`chunk.usage`), except in an event
named `thread.*` (its last `event` field: the Assistants API's events): the SDK's
`Stream` (legacy mode, every chat and completions stream) hands those on as
`{"data": ..., "event": ...}`, so neither their `usage` nor their `error` is read at the
top (its `event == "error"` test inside that branch can never hold). Other event names,
`error` included, change nothing.

So a usage chunk written over several `data:` lines is one JSON document to the client,
and two usage documents in one event are none (their join does not parse). A stream's
last event, left without its blank line by the backend, is dispatched too: the gateway's
own bytes after it (its receipt line or its error event) end with one.

Bounded and cheap: only events holding `"usage"`, `"error"`, `[DONE]` or an escape of
an ASCII letter (`"\\u0075sage"` is a `usage` key to a JSON parser) are parsed (no other
event can show a usage, raise or stop the SDK), a read of whole events holding none of
them costs four searches (`bytes.find`, not a regular expression: in `timeit`, a quarter
of its time on one event, a twelfth on a read of 64), a read that holds some has only
those events split into lines and parsed (a fast server's whole stream, coalesced into
one read that ends with `[DONE]`, is not parsed event by event; past `_FEW_WORTH` of
them, the rest of the read is read whole, every event: per event, the searches and
slices cost more than a parse, 7 times as much as reading it on a read of `:"usage"`
comments), and the unfinished event
is kept only up to `max_event` bytes (64 KiB: comments and all): a longer event is not
read.
Where the SDK raises (it reads no further), the reader stops: the usage is what the SDK
showed before. It raises at a line that is not UTF-8 (its decoder's `bytes.decode`: a
read that is all ASCII, the usual one, costs one `isascii`; any other is checked as it
comes, a character split across reads kept for the next), at an event dispatched without
data (a non-empty `event` name, a `retry` that `int()` reads, or an `id`, which the SDK
keeps for every later event: its `json()` of "" raises; a read holding `id:`, `event:` or
`retry:`, or any read once an id is set, is read whole, every event), and at an event
whose data is not JSON (a `thread.*` one too) among the events parsed. An event that holds
none of the needles and whose data is not JSON (`data: x`) is not parsed and so not
stopped at, where the SDK raises: telling would take parsing every event of every stream
(a read that is read whole tells). A read that is one `data: {` line and its blank line
(`one_data_line`, a paced server's usual read: one event, the SDK parses it) is parsed
once, with orjson, in place of the searches: its usage and error are read from the
document, and one whose data is not JSON stops the reader, whatever it holds
(`data: {x`); one orjson refuses (`NaN`, say) or longer than `_SHORT_LINE` (where
nesting may pass `MAX_DEPTH`) is read as any event (`read_json`). An event whose data is
past the bounds the gateway reads within (`usage_read.PastBounds`: nested deeper than 512, say)
may show the client a usage: the usage is then unknown (`usage` None, `unknown` set)
until a later event shows one, never an earlier event's; one whose data holds no marker
cannot show one, and leaves the usage as it was (the one-pass read parses such events).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Final

import orjson

from gateway.api.usage_read import MAX_DEPTH, PastBounds, counts_of, read_json

__all__ = [
    "BLANK_TAILS",
    "LINE_END_BYTES",
    "EventReader",
    "event_end",
    "last_event_end",
    "one_data_line",
]

_MAX_EVENT: Final = 64 * 1024
# Events of one read found and read one by one; past them, the rest is read in one pass.
_FEW_WORTH: Final = 4
_LINE_ENDS: Final = re.compile(rb"\r\n|\r|\n")
# What makes an event worth parsing (see the module's text): these, or `\u00` followed
# by 4-7 (an escaped ASCII letter may spell `usage` or `error`).
_NEEDLES: Final = (b'"usage"', b'"error"', b"[DONE]")
_ESCAPE: Final = b"\\u00"
_LETTER_ESCAPE: Final = re.compile(rb"\\u00[4-7]")
# Two line ends in a row: a blank line (its own end may be the CR of a CRLF).
_BLANK: Final = re.compile(rb"\n\n|\r\r|\n\r")
_LF: Final = 10
_CR: Final = 13
# A one-line read's length up to which its data (after `data: `, before its two LFs) is
# too short to nest past `MAX_DEPTH` (each level takes two bytes): orjson reads it as
# `read_json` does.
_SHORT_LINE: Final = len(b"data: \n\n") + 2 * MAX_DEPTH + 1


class EventReader:
    """One relayed stream's events as its client's SDK reads them (what the gateway relays
    in, in order); `finish` at the stream's end."""

    def __init__(self, *, max_event: int = _MAX_EVENT) -> None:
        self.usage: dict[str, int] | None = None  # the last usage shown
        # an event past the read bounds came after the last usage read: it may show one
        self.unknown = False
        self.error_event = False  # an error event of the backend's was read (the SDK raised)
        self.stopped = False  # `[DONE]` or an error event: the SDK reads no further
        self._max_event = max_event
        self._raw = b""  # the unfinished event's bytes, from its start
        self._over = False  # inside an event let go past `max_event`
        self._tail = b""  # a UTF-8 character's first bytes, its rest in the next read
        self._id = False  # the SDK's last event id is set: a blank line dispatches

    def feed(self, data: bytes, one_line: bool = False) -> None:
        """Read `data` on; `one_line`: it is `one_data_line` (the caller tested it)."""
        if self.stopped or not data:
            return
        if self._tail or not data.isascii():  # the SDK raises at a line that is not UTF-8
            bad = self._not_utf8(data)
            if bad is not None:
                if bad > 0:
                    self._take(data[:bad])
                self.stopped = True
                return
        if one_line and not self._over and not self._id:
            # One event, which the SDK parses: parsed once here (`_dispatch`, written out:
            # a paced stream's every read), not searched for what makes it worth parsing.
            if not self._raw and len(data) <= _SHORT_LINE:
                try:
                    doc = orjson.loads(data[6:-2])  # (a `{` starts it: an object)
                except orjson.JSONDecodeError:
                    pass  # not JSON, or what the standard library may read: as any event
                else:
                    if doc.get("error"):  # the SDK's test: a truthy `error`
                        self.error_event = self.stopped = True
                    elif "usage" in doc and (counts := counts_of(doc["usage"])) is not None:
                        self.usage, self.unknown = counts, False
                    return
            # Else as any event, with what of it came before (comments, say) if any.
            buffer, self._raw = self._raw + data, b""
            self._read(_lines(buffer), dispatch=False)
            return
        if (  # the usual read: whole events (it ends with a blank line), none worth parsing
            not self._raw
            and not self._over
            and (
                (tail := data[-2:]) in BLANK_TAILS
                or (tail == b"\r\n" and data[-3:-2] in LINE_END_BYTES)
            )
            # `_worth`, written out: this runs once per relayed read
            and data.find(b'"usage"') < 0
            and data.find(b'"error"') < 0
            and data.find(b"[DONE]") < 0
            and (data.find(_ESCAPE) < 0 or _escape_at(data, 0, len(data)) < 0)
            # no field that dispatches an event without data (`_fields_at`)
            and data.find(b"id:") < 0
            and data.find(b"event:") < 0
            and data.find(b"retry:") < 0
            and not self._id
        ):
            return
        self._take(data)

    def _take(self, data: bytes) -> None:
        """Read `data` (UTF-8, as far as it goes) on from the unfinished event."""
        buffer = self._raw + data if self._raw else data
        if self._over:  # the rest of an event let go: to its blank line
            found = _BLANK.search(buffer)
            if found is None:
                self._raw = buffer[-1:]  # a line end, with the next read's, is a blank line
                return
            self._over = False
            buffer = buffer[_past_blank(buffer, found.start()) :]
        cut = last_event_end(buffer)
        if cut:
            if self._id or _fields_at(buffer, 0, cut):  # an event may lack data: read all
                self._read(_lines(buffer[:cut]), dispatch=False)
            else:
                self._read_worth(buffer, cut)
        rest = buffer[cut:]
        if len(rest) > self._max_event:  # let go unread: the usage it may hold is unknown
            self._raw, self._over = rest[-1:], True
            self.usage, self.unknown = None, True
        else:
            self._raw = rest

    def whole_without_usage(self, data: bytes) -> None:
        """`feed` for a read that ends with a blank line and holds no `"usage"`: the
        stream watch tested both on it (its usual read), so only the other markers are
        searched here (those `feed`'s usual read tests besides: not UTF-8, a field that
        dispatches an event without data). One search fewer per relayed read, and no
        second test of its end (a `one_data_line` read goes to `feed`: it is parsed)."""
        if (
            not self._raw
            and not self._over
            and not self._tail
            and not self._id
            and data.isascii()
            and data.find(b'"error"') < 0
            and data.find(b"[DONE]") < 0
            and (data.find(_ESCAPE) < 0 or _escape_at(data, 0, len(data)) < 0)
            and data.find(b"id:") < 0
            and data.find(b"event:") < 0
            and data.find(b"retry:") < 0
        ):
            return
        self.feed(data)

    def finish(self) -> None:
        """The stream ended: its last event, if unfinished, is dispatched (the gateway's
        bytes after the backend's end it)."""
        rest, self._raw = self._raw, b""
        if self._tail:  # a character cut short: its line raises before any dispatch
            self.stopped = True
            return
        if (
            rest
            and not self._over
            and not self.stopped
            and (self._id or _fields_at(rest, 0, len(rest)) or _worth(rest, 0, len(rest)))
        ):
            self._read(_lines(rest), dispatch=True)

    def _not_utf8(self, data: bytes) -> int | None:
        """Where in `data` the first byte that is not UTF-8 is (negative: a character
        begun in an earlier read); None while all is (a character's first bytes at its
        end kept for the next read). Strict, as `bytes.decode`: no surrogates, no
        overlong forms."""
        text = self._tail + data if self._tail else data
        try:
            used = codecs.utf_8_decode(text, "strict", False)[1]
        except UnicodeDecodeError as exc:
            return exc.start - len(self._tail)
        self._tail = text[used:]
        return None

    def _read_worth(self, buffer: bytes, cut: int) -> None:
        """Read the events of `buffer[:cut]` (whole events) worth parsing (the module's
        text): the first `_FEW_WORTH` one by one, the rest of a read that holds more (a
        server that writes `"usage":null` in every chunk, or a hostile one's `:"usage"`
        comment line per event) in one pass over every event, as cheap per event as
        reading gets (one by one, the searches, slices and splits cost 2 to 7 times it)."""
        for count, (begin, end) in enumerate(_worth_events(buffer, cut)):
            if count == _FEW_WORTH:
                self._read(_lines(buffer[begin:cut]), dispatch=False)
                return
            self._read(_lines(buffer[begin:end]), dispatch=False)
            if self.stopped:
                return

    def _read(self, lines: list[bytes], *, dispatch: bool) -> None:
        """Read whole lines from an event's start; `dispatch`: end with a blank line."""
        data: list[bytes] = []
        event = b""  # the event's name: its last `event` field
        retry = False  # a `retry` field with an integer
        for line in lines:
            if not line:
                self._dispatch(data, event, retry)
                if self.stopped:
                    return
                data, event, retry = [], b"", False
            elif line[0] != 58:  # not a comment (`:`)
                name, _, value = line.partition(b":")
                value = value[1:] if value[:1] == b" " else value
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    event = value
                elif name == b"id":
                    if b"\0" not in value:  # (the SDK keeps the last id, never resets it)
                        self._id = bool(value)
                elif name == b"retry":
                    retry = retry or _integer(value)
        if dispatch:
            self._dispatch(data, event, retry)

    def _dispatch(self, data: list[bytes], event: bytes, retry: bool) -> None:
        if not data:  # dispatched by a name, id or retry: the SDK's json("") raises
            if event or retry or self._id:
                self.stopped = True
            return
        joined = b"\n".join(data)
        if joined.startswith(b"[DONE]"):
            self.stopped = True
            return
        try:
            doc = read_json(joined, line=True)
        except PastBounds:  # the client may read a usage here: not the earlier one, unless
            # no usage can be in it (a thread.* event's is handed on nested; one read in
            # one pass reads every event, those without a needle too)
            if not event.startswith(b"thread.") and _worth(joined, 0, len(joined)):
                self.usage, self.unknown = None, True
            return
        except ValueError:  # the SDK's json() raises: it reads no further
            self.stopped = True
            return
        if event.startswith(b"thread."):  # handed on nested: no usage, no error read
            return
        if not isinstance(doc, dict):
            return
        if doc.get("error"):  # the SDK's test: a truthy `error`
            self.error_event = self.stopped = True
            return
        counts = counts_of(doc.get("usage"))
        if counts is not None:
            self.usage, self.unknown = counts, False


def one_data_line(data: bytes) -> bool:
    """Whether `data` is one line `data: {...` and the blank line that ends its event, LF
    each, nothing else: a paced server's usual read (one token per write). Its one line is
    no comment (no `owngate-` comment to remove), no field but `data` (none that dispatches
    an event without data) and its value starts `{` (not `[DONE]`): what four searches of
    the read per filter otherwise rule out, told by two `memchr`s (one-byte `find`s)."""
    return (
        data[:7] == b"data: {"
        and data.find(b"\n") == len(data) - 2
        and data[-1] == _LF
        and data.find(b"\r") < 0
    )


def _fields_at(data: bytes, start: int, end: int) -> bool:
    """Whether `data[start:end]` may hold a field that dispatches an event without data
    (`id:`, `event:`, `retry:`; also in a data line's text: then it is read whole)."""
    return (
        data.find(b"id:", start, end) >= 0
        or data.find(b"event:", start, end) >= 0
        or data.find(b"retry:", start, end) >= 0
    )


def _integer(value: bytes) -> bool:
    """Whether the SDK's `int()` reads `value` (a `retry` field's: then it dispatches)."""
    try:
        int(value.decode())
    except ValueError:  # (UnicodeDecodeError is one)
        return False
    return True


def _worth(data: bytes, start: int, end: int) -> bool:
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


def _worth_events(data: bytes, cut: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each event of `data[:cut]` (whole events) that holds one of
    `_NEEDLES` or an escape of an ASCII letter, in order. Linear in `cut`: each search
    starts past the last event yielded, and one needle is searched again only once its
    last find is behind it (an event of each kind after the other must not search the
    rest of the read once per event)."""
    found = [data.find(needle, 0, cut) for needle in _NEEDLES] + [_escape_at(data, 0, cut)]
    pos = 0
    while True:
        at = min((f for f in found if f >= 0), default=-1)
        if at < 0:
            return
        begin = last_event_end(data, pos, at)  # the start of the event holding it
        pos = event_end(data, at)  # its end, at most `cut`: a blank line ends the read there
        yield begin, pos
        for i, f in enumerate(found):
            if 0 <= f < pos:
                found[i] = (
                    _escape_at(data, pos, cut) if i == 3 else data.find(_NEEDLES[i], pos, cut)
                )


def _lines(chunk: bytes) -> list[bytes]:
    """`chunk`'s lines (the last one possibly unfinished)."""
    lines = _LINE_ENDS.split(chunk)
    if not lines[-1]:
        lines.pop()  # after the last line end: no line
    return lines


# A read ending with a blank line ends in one of these, or in CRLF after a line end.
BLANK_TAILS: Final = (b"\n\n", b"\r\r", b"\n\r")
LINE_END_BYTES: Final = (b"\n", b"\r")


def _past_blank(data: bytes, at: int) -> int:
    """Past the blank line whose two line ends start at `at` (`_BLANK`)."""
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
    return _past_blank(data, at) if at >= 0 else start


def event_end(data: bytes, start: int) -> int:
    """Where the event starting at `start` ends, after its blank line (the LF of a CRLF
    included when it is there); -1 while it has not ended."""
    found = _BLANK.search(data, start)
    return _past_blank(data, found.start()) if found is not None else -1
