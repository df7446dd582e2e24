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
own bytes after it (its receipt line, its error event, or with neither the line ends
`stream_writes.end_stream` writes) end with one.

Exact whatever the reads: every event is parsed once, as the SDK parses it, so one whose
data is not JSON (`data: {x`, which holds nothing a search could pick it by) stops the
reader whether it came alone, coalesced with others or cut across reads. Bounded and
cheap: a read of whole events of the usual shape, each one `data: ` line and its blank
line, LF alone (`_whole`: one split, one count), has each value parsed with orjson (up to
`_SHORT_DATA` bytes, which cannot nest past `MAX_DEPTH`; one orjson refuses (`NaN`, say)
or longer is read as any event, `read_json`); a paced server's one-line read
(`sse_framing.one_data_line`) skips the split. Any other read is split into lines once and read line
by line. A value that is the last parsed chunk's but for a plain content string (no
quote, backslash or control character: `_learn`) is that document, not parsed again.
The unfinished event is kept only up to `max_event` bytes (64 KiB: comments and
all): a longer event is not read, but searched for `id` lines (gateway/sse_ids.py), which
the SDK keeps (`keeps_id`: before, an id in such an event went unseen, so the gateway
wrote no empty `id` line and the SDK raised at its receipt line).
Where the SDK raises (it reads no further), the reader stops: the usage is what the SDK
showed before. It raises at a line that is not UTF-8 (its decoder's `bytes.decode`: a
read that is all ASCII, the usual one, costs one `isascii`; any other is checked as it
comes, a character split across reads kept for the next), at an event dispatched without
data (a non-empty `event` name, a `retry` that `int()` reads, or an `id`, which the SDK
keeps for every later event: its `json()` of "" raises), and at an event whose data is
not JSON (a `thread.*` one too). An event whose data is past the bounds the gateway
reads within (`usage_read.PastBounds`: nested deeper than 512, say) may show the client a
usage: the usage is then unknown (`usage` None, `unknown` set) until a later event shows
one, never an earlier event's; one whose data holds no marker
(`sse_data.may_show_usage`) cannot show one, and leaves the usage as it was. A usage
object with a count that is no JSON integer (`3.9`, `"3"`, `true`) is shown to the client
as it is: the usage is then none, never an earlier event's (docs/provenance.md); so is a
usage that is no object (`"usage": 7`)."""

from __future__ import annotations

import codecs
import re
from typing import Final

import orjson

from gateway.api.sse_data import MAX_EVENT, may_show_usage, not_json, retry_integer
from gateway.api.sse_framing import BLANK, LF, last_event_end, past_blank
from gateway.api.usage_read import MAX_DEPTH, PastBounds, counts_in, read_json
from gateway.sse_ids import IdLines

__all__ = ["EventReader"]

_LINE_ENDS: Final = re.compile(rb"\r\n|\r|\n")
# A `data` value's length up to which it is too short to nest past `MAX_DEPTH` (each level
# takes two bytes): orjson reads it as `read_json` does.
_SHORT_DATA: Final = 2 * MAX_DEPTH + 1
_SHORT_LINE: Final = len(b"data: \n\n") + _SHORT_DATA  # a one-line read's
# Keys of the string a chat or completions chunk changes from one token to the next
# (`EventReader._learn`), and that string's characters up to its closing quote when it
# holds no escape and no control character (JSON as it is, to either parser).
_VARYING: Final = (b'"content":"', b'"reasoning_content":"', b'"text":"')
_PLAIN_STRING: Final = re.compile(rb'[^\x00-\x1f"\\]*"')


class EventReader:
    """One relayed stream's events as its client's SDK reads them (what the gateway relays
    in, in order); `finish` at the stream's end."""

    def __init__(self, *, max_event: int = MAX_EVENT) -> None:
        self.usage: dict[str, int] | None = None  # the last usage shown
        # an event past the read bounds came after the last usage read (it may show one),
        # or the last usage shown has a count that is not an integer: no usage to state
        self.unknown = False
        self.error_event = False  # an error event of the backend's was read (the SDK raised)
        self.stopped = False  # `[DONE]` or an error event: the SDK reads no further
        # it stopped at an event whose data starts `[DONE]` (not at an error, a line it
        # could not read, or a `data: [DONE]` line that did not start its event's data)
        self.done = False
        self._max_event = max_event
        self._raw = b""  # the unfinished event's bytes, from its start
        self._over = False  # inside an event let go past `max_event`
        # `usage` and `unknown` before that event was let go
        self._before_over: tuple[dict[str, int] | None, bool] = (None, False)
        self._tail = b""  # a UTF-8 character's first bytes, its rest in the next read
        self._id = False  # the SDK's last event id is set: a blank line dispatches
        # an event let go unread (`_over`) had an `id` line, with no later `id` line read:
        # the SDK may keep an id (`keeps_id`); its `_ids` (gateway/sse_ids.py)
        self._maybe_id = False
        self._ids = IdLines()
        # the bytes read so far end with a CR, maybe a CRLF's first half: an LF starting
        # the next read ends no line (the SDK's `_skip_lf`), it is no blank line
        self._skip_lf = False
        # The last chunk parsed that showed nothing (`_learn`), cut around its varying
        # string: a value that is `_head`, plain characters and `_foot` is JSON that shows
        # nothing too, not parsed; `_line_*`: the same as a one-line read.
        self._head = self._line_head = b"\xff"  # (no UTF-8 value starts so)
        self._foot = self._line_foot = b""
        self._cut = self._line_cut = 0  # where the closing quote is, from the end

    def feed(self, data: bytes, one_line: bool = False) -> None:
        """Read `data` on; `one_line`: it is `one_data_line` (the caller tested it)."""
        if self.stopped or not data:
            return
        if self._skip_lf:
            self._skip_lf = False
            if data[0] == LF:
                data = data[1:]
                if not data:
                    return
        if self._tail or not data.isascii():  # the SDK raises at a line that is not UTF-8
            bad = self._not_utf8(data)
            if bad is not None:
                if bad > 0:
                    self._take(data[:bad])
                self._raise_inside()
                return
        if not self._raw and not self._over:
            if one_line:  # (the caller tested it: one event, `data: {`, LF, no field)
                # `_values` written out (a paced stream's every read): parsed once
                if (
                    data.startswith(self._line_head)
                    and data.endswith(self._line_foot)
                    and _PLAIN_STRING.fullmatch(
                        data, len(self._line_head), len(data) - self._line_cut
                    )
                    is not None
                ):
                    return  # the last chunk's shape: JSON, showing nothing
                if len(data) <= _SHORT_LINE:
                    try:
                        doc = orjson.loads(data[6:-2])  # (a `{` starts it: an object)
                    except orjson.JSONDecodeError:
                        pass  # not JSON, or what the standard library may read
                    else:
                        if doc.get("error"):  # the SDK's test: a truthy `error`
                            self.error_event = self.stopped = True
                        elif doc.get("usage") is None:
                            self._learn(data[6:-2])
                        else:
                            self._shown(doc, data[6:-2])
                        return
                self._dispatch([data[6:-2]], b"", False)
                return
            if data[-2:] == b"\n\n":  # whole events, the usual read
                self._whole(data)
                return
        self._take(data)

    def _take(self, data: bytes) -> None:
        """Read `data` (UTF-8, as far as it goes) on from the unfinished event."""
        buffer = self._raw + data if self._raw else data
        if self._over:  # the rest of an event let go: to its blank line
            found = BLANK.search(buffer)
            if found is None:
                self._let_go(data)
                self._raw = buffer[-1:]  # a line end, with the next read's, is a blank line
                return
            self._over = False
            end = past_blank(buffer, found.start())
            self._let_go(buffer[len(buffer) - len(data) : end])
            buffer = buffer[end:]
        cut = last_event_end(buffer)
        if cut:
            self._whole(buffer[:cut])
        rest = buffer[cut:]
        if len(rest) > self._max_event:  # let go unread: the usage it may hold is unknown
            self._raw, self._over, self._ids = rest[-1:], True, IdLines()
            self._let_go(rest)
            self._before_over = self.usage, self.unknown
            self.usage, self.unknown = None, True
        else:
            self._raw = rest
            # (fed whole events only, a read ends with LF: a CR only here ends the bytes)
            self._skip_lf = not rest and buffer[-1:] == b"\r"

    @property
    def keeps_id(self) -> bool:
        """Whether the SDK reads on holding an event id, so that a blank line, even one
        after a whole event (the gateway's receipt line ends with one), dispatches an
        event without data, whose `json()` of "" raises."""
        return (self._id or self._maybe_id) and not self.stopped

    def _let_go(self, data: bytes) -> None:
        """`data` is of an event let go unread: an `id` line in it may set the SDK's id."""
        self._ids.feed(data)
        self._maybe_id = self._maybe_id or self._ids.seen

    def finish(self) -> None:
        """The stream ended: its last event, if unfinished, is dispatched (the gateway's
        bytes after the backend's end it)."""
        rest, self._raw = self._raw, b""
        if self._tail:  # a character cut short: its line raises before any dispatch
            self._raise_inside()
            return
        if rest and not self._over and not self.stopped:
            self._read(_lines(rest), dispatch=True)

    def _raise_inside(self) -> None:
        """The SDK raises at a line that is not UTF-8, here: it reads no further, and an
        event let go past `max_event` that the line is in is one it never dispatched
        (the line comes before its blank line), so it showed no usage."""
        self.stopped = True
        if self._over:
            self.usage, self.unknown = self._before_over

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

    def _whole(self, chunk: bytes) -> None:
        """Read the whole events `chunk` (from an event's start to a blank line's end),
        every one. The usual shape, each event one `data: ` line and its blank line, LF
        alone (a line end counted per event: no other line, no field, no comment), has
        its values split out with one split and parsed (`_values`); any other is read
        line by line (`_read`)."""
        if chunk[:6] == b"data: " and chunk[-2:] == b"\n\n" and chunk.find(b"\r") < 0:
            values = chunk[6:-2].split(b"\n\ndata: ")
            if chunk.count(b"\n") == 2 * len(values):
                self._values(values)
                return
        self._read(_lines(chunk), dispatch=False)

    def _values(self, values: list[bytes] | tuple[bytes, ...]) -> None:
        """Dispatch events of one `data` line each, their values in order: each parsed
        once with orjson (`_dispatch` written out), where it is short enough not to nest
        past `MAX_DEPTH`, unless it has the last parsed chunk's shape (`_learn`); what
        orjson refuses, or a longer value, as any event."""
        head, foot, cut = self._head, self._foot, self._cut
        for value in values:
            if (
                value.startswith(head)
                and value.endswith(foot)
                and _PLAIN_STRING.fullmatch(value, len(head), len(value) - cut) is not None
            ):
                continue  # JSON showing nothing, as the chunk it has the shape of
            if len(value) <= _SHORT_DATA:
                try:
                    doc = orjson.loads(value)
                except orjson.JSONDecodeError:  # not JSON (`[DONE]` too), or what the
                    self._dispatch([value], b"", False)  # standard library may read
                else:
                    if type(doc) is dict:
                        if doc.get("error"):  # the SDK's test: a truthy `error`
                            self.error_event = self.stopped = True
                            return
                        if doc.get("usage") is None:
                            self._learn(value)
                            head, foot, cut = self._head, self._foot, self._cut
                        else:
                            self._shown(doc, value)
                    continue
            else:
                self._dispatch([value], b"", False)
            if self.stopped:
                return

    def _learn(self, value: bytes) -> None:
        """Keep the shape of `value`, a JSON object (orjson read it) whose `error` is falsy
        and `usage` absent or null, around its first `_VARYING` string: what comes before
        that string's characters (`_head`), what from its closing quote (`_foot`). Kept
        only when `_head` holds no backslash and an even number of quotes before its last:
        every quote in it opens or closes a string, so that last one, after a `:` outside
        any string, opens a string value that holds no escape (its key, one of
        `_VARYING`'s, is neither `error` nor `usage`, and no falsy `error` or null `usage`
        holds one). Any value of that shape is the same document, that string aside:
        both parsers read it, and its `error` and `usage` are those of `value`."""
        for key in _VARYING:
            at = value.find(key)
            if at >= 0:
                break
        else:
            return
        start = at + len(key)
        if value.find(b"\\", 0, start) >= 0 or value.count(b'"', 0, start - 1) % 2:
            return
        string = _PLAIN_STRING.match(value, start)
        if string is None:
            return
        self._head, self._foot = value[:start], value[string.end() - 1 :]
        self._line_head, self._line_foot = b"data: " + self._head, self._foot + b"\n\n"
        self._cut, self._line_cut = len(self._foot) - 1, len(self._line_foot) - 1

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
                        self._id, self._maybe_id = bool(value), False
                elif name == b"retry":
                    retry = retry or retry_integer(value)
        if dispatch:
            self._dispatch(data, event, retry)

    def _dispatch(self, data: list[bytes], event: bytes, retry: bool) -> None:
        if not data:  # dispatched by a name, id or retry: the SDK's json("") raises
            if event or retry or self._id:
                self.stopped = True
            return
        joined = b"\n".join(data)
        if joined.startswith(b"[DONE]"):
            self.stopped = self.done = True
            return
        try:
            doc = read_json(joined, line=True)
        except PastBounds:
            if not_json(joined):  # the SDK's `json.loads` refuses it at any depth: it
                self.stopped = True  # raises here, reads no further
                return
            # the client may read a usage here: not the earlier one, unless
            # no usage can be in it (a thread.* event's is handed on nested; one read in
            # one pass reads every event, those without a needle too)
            if not event.startswith(b"thread.") and may_show_usage(joined, 0, len(joined)):
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
        self._shown(doc, joined)

    def _shown(self, doc: dict[str, object], value: bytes) -> None:
        """`doc` (parsed from `value`) is shown to the client: a `usage` object in it is
        the last usage shown, its counts, or none when a count is not a JSON integer
        (`3.9`, `"3"`: the SDK shows it as it is; never an earlier usage's counts). A
        usage that is no object (`7`) is shown as it is too (`chunk.usage`): none."""
        usage = doc.get("usage")
        if isinstance(usage, dict):
            counts = counts_in(doc, value)
            self.usage, self.unknown = counts, counts is None
        elif usage is not None:
            self.usage, self.unknown = None, True


def _lines(chunk: bytes) -> list[bytes]:
    """`chunk`'s lines (the last one possibly unfinished)."""
    lines = _LINE_ENDS.split(chunk)
    if not lines[-1]:
        lines.pop()  # after the last line end: no line
    return lines
