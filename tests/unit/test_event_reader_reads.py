"""`EventReader` parses every event of a read once, as the client's SDK does (any event
whose data is not JSON stops it), and reads a coalesced read in time linear in it
(gateway/api/sse_events.py).

What it reads is held to the SDK's own decoder by tests/unit/test_stream_watch.py; these
tests hold how much of a coalesced read it parses and searches."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api import sse_events
from gateway.api.sse_events import EventReader
from gateway.api.sse_framing import last_event_end
from gateway.api.usage_read import read_json

HEAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":'
TOKEN = HEAD + b'[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = HEAD + b'[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}\n\n'
DONE = b"data: [DONE]\n\n"
COUNTS = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The data the reader parses, in order: by orjson directly (the usual shape,
    `_values`) or by `read_json` (any other); one that orjson refuses and `read_json`
    then reads is noted once."""
    parsed: list[bytes] = []

    def counting(data: bytes, *, line: bool = False) -> object:
        if not parsed or parsed[-1] is not data:
            parsed.append(data)
        return read_json(data, line=line)

    def loads(data: bytes) -> object:
        parsed.append(data)
        return orjson.loads(data)

    monkeypatch.setattr(sse_events, "read_json", counting)
    monkeypatch.setattr(
        sse_events, "orjson", SimpleNamespace(loads=loads, JSONDecodeError=orjson.JSONDecodeError)
    )
    return parsed


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_a_coalesced_stream_parses_each_event_once(
    monkeypatch: pytest.MonkeyPatch, ending: bytes
) -> None:
    # A fast server's whole stream in one read, as TCP coalesces it: the SDK parses each
    # of its events (one it refuses stops it), so the reader does too, each once; in the
    # usual shape (LF), a chunk that is the last parsed one but for its plain content
    # string is JSON showing nothing without a parse (`EventReader._learn`).
    parsed = _counting_reads(monkeypatch)
    read = (TOKEN * 64 + USAGE + DONE).replace(b"\n", ending)
    reader = EventReader()
    reader.feed(read)
    value = len(b"data: ")
    tokens = 1 if ending == b"\n" else 64
    expected = [TOKEN.split(b"\n")[0][value:]] * tokens + [USAGE.split(b"\n")[0][value:]]
    assert parsed[: tokens + 1] == expected
    parsed[: tokens + 1] = []
    assert parsed in ([], [b"[DONE]"])  # (orjson may try it before it is told)
    assert reader.usage == COUNTS and reader.stopped
    assert not reader.error_event and not reader.unknown


def test_every_event_is_parsed_in_order_up_to_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed = _counting_reads(monkeypatch)
    escaped = b'data: {"\\u0075sage":{"prompt_tokens":6}}\n\n'
    error = b'data: {"error":{"message":"boom"}}\n\n'
    events = [*[TOKEN] * 3, USAGE, *[TOKEN] * 2, escaped, TOKEN, error]
    reader = EventReader()
    reader.feed(b"".join(events) + USAGE + DONE)
    # Nothing after it; the tokens after the first are that one's shape (not parsed).
    shown = [events[0], USAGE, escaped, error]
    assert parsed == [event[len(b"data: ") : -2] for event in shown]
    assert reader.usage == {"prompt_tokens": 6, "completion_tokens": 0, "total_tokens": 0}
    assert reader.error_event and reader.stopped


class _Counted(bytes):
    """A read that counts the bytes its searches look at (up to what they find)."""

    scanned = 0

    def find(self, sub: bytes, start: int = 0, end: int | None = None) -> int:  # type: ignore[override]
        end = len(self) if end is None else end
        at = super().find(sub, start, end)
        _Counted.scanned += max(0, (end if at < 0 else at + len(sub)) - start)
        return at

    def rfind(self, sub: bytes, start: int = 0, end: int | None = None) -> int:  # type: ignore[override]
        end = len(self) if end is None else end
        at = super().rfind(sub, start, end)
        _Counted.scanned += max(0, end - (start if at < 0 else at))
        return at


def test_finding_the_events_worth_it_is_linear_in_the_read() -> None:
    # Every event worth parsing, each kind after the other: a needle searched again from
    # each event to the end of the read would cover it once per event (quadratic).
    usage = b'data: {"choices":[],"usage":null}\n\n'
    error = b'data: {"choices":[],"error":null}\n\n'
    read = _Counted((usage + error) * 1000 + TOKEN)
    _Counted.scanned = 0
    EventReader().feed(read)
    assert _Counted.scanned <= 16 * len(read)


def test_an_escaped_usage_key_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Go server writes `<` as `\u003c`: no letter, no usage key; `\u0075` is a `u`.
    parsed = _counting_reads(monkeypatch)
    markup = HEAD + b'[{"index":0,"delta":{"content":"\\u003cb\\u003e"}}]}\n\n'
    usage = b'data: {"choices":[],"\\u003c":1,"\\u0075sage":{"prompt_tokens":6}}\n\n'
    reader = EventReader()
    reader.feed(markup * 50)
    assert len(parsed) == 50 and reader.usage is None
    reader.feed(markup * 50 + usage + markup)
    assert len(parsed) == 102
    assert reader.usage == {"prompt_tokens": 6, "completion_tokens": 0, "total_tokens": 0}


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"choices":[],"usage":null}\n\n',  # a server's `"usage":null` in every chunk
        b':"usage"\n\n',  # a hostile backend's: a comment per event, nothing to parse
        b'data: {"choices":[],"\\u0075":1}\r\n\r\n',
    ],
)
def test_a_read_of_many_events_is_split_into_lines_once_at_most(
    monkeypatch: pytest.MonkeyPatch, event: bytes
) -> None:
    # Event by event, the searches, slices and splits cost 2 to 7 times reading the whole
    # read in one pass (callgrind, docs/performance.md): the usual shape is split by its
    # values, any other read into lines once, every event of it parsed once.
    splits: list[bytes] = []
    lines = sse_events._lines

    def counting(chunk: bytes) -> list[bytes]:
        splits.append(chunk)
        return lines(chunk)

    monkeypatch.setattr(sse_events, "_lines", counting)
    parsed = _counting_reads(monkeypatch)
    read = event * 1000 + USAGE + TOKEN * 3
    reader = EventReader()
    reader.feed(read)
    assert len(splits) <= 1
    assert b"".join(splits) in (b"", read)  # every event read, each once
    assert reader.usage == COUNTS and not reader.stopped and not reader.unknown
    # each parsed once, but the last two tokens of the usual shape: the first one's
    shaped = 2 if event.startswith(b"data: ") and b"\r" not in event else 0
    assert len(parsed) == read.count(b"data:") - shaped


def test_an_event_past_the_read_bounds_that_shows_no_usage_leaves_the_usage_known() -> None:
    # Past the first few events worth parsing, a read is read in one pass, every event:
    # one past the parse's bounds (nesting, values) that holds no usage key cannot change
    # the usage the client's SDK read; it made the record's usage unknown, or not,
    # depending on how the stream was cut into reads. (Nested past usage_read's 512.)
    tail = b"data: " + b"[" * 600 + b"]" * 600 + b"\n\n"
    for reads in ([USAGE * 6 + tail], [USAGE * 6, tail]):
        reader = EventReader()
        for read in reads:
            reader.feed(read)
        reader.finish()
        assert reader.usage == COUNTS and not reader.unknown


class _Searched(bytes):
    """A read that notes what it is searched backwards for."""

    needles: ClassVar[list[bytes]] = []

    def rfind(self, sub: bytes, start: int = 0, end: int | None = None) -> int:  # type: ignore[override]
        _Searched.needles.append(sub)
        return super().rfind(sub, start, len(self) if end is None else end)


def test_a_coalesced_read_without_a_cr_is_not_searched_backwards_for_one() -> None:
    # The read that ends a fast server's stream holds `[DONE]` and is split at its last
    # blank line: two backward searches of the whole read for `\r\r` and `\n\r` cost a
    # fifth of a coalesced chunk (callgrind); a read without a CR holds neither.
    _Searched.needles = []
    reader = EventReader()
    reader.feed(_Searched(TOKEN * 64 + DONE + b"data: {"))  # cut at its last blank line
    assert reader.stopped
    assert b"\n\n" in _Searched.needles
    assert not [n for n in _Searched.needles if len(n) > 1 and b"\r" in n]


@given(
    data=st.binary(max_size=40).map(lambda b: bytes(b"\n\r:a"[x % 4] for x in b)),
    start=st.integers(0, 40),
    end=st.integers(0, 40),
)
def test_the_last_event_end_is_the_last_blank_line_of_any_kind(
    data: bytes, start: int, end: int
) -> None:
    start = min(start, len(data))
    end = max(start, min(end, len(data)))
    at = max(data.rfind(sep, start, end) for sep in (b"\n\n", b"\r\r", b"\n\r"))
    if at < 0:
        expected = start
    elif data[at + 1] == 13 and data[at + 2 : at + 3] == b"\n":
        expected = at + 3
    else:
        expected = at + 2
    assert last_event_end(data, start, end) == expected
