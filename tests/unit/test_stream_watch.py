"""`StreamWatch` and `ask_for_usage`: the SSE end, the usage chunk held back, nothing else.

Each stream is fed whole and split at every byte, since a backend's reads cut lines
anywhere.
"""

from __future__ import annotations

import itertools
import json
import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from gateway.api.body_rewrites import ask_for_usage
from gateway.api.sse import StreamWatch
from gateway.api.sse_events import EventReader

HEAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":'
ROLE = HEAD + b'[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = HEAD + b'[{"index":0,"delta":{"content":"data: [DONE]"}}]}\n\n'
FINISH = HEAD + b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = HEAD + b'[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}\n\n'
DONE = b"data: [DONE]\n\n"
COUNTS = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


def feed(watch: StreamWatch, stream: bytes, cut: int | None) -> bytes:
    pieces = [stream] if cut is None else [stream[:cut], stream[cut:]]
    return b"".join(watch.feed(piece) for piece in pieces) + watch.flush()


def cuts(stream: bytes) -> list[int | None]:
    return [None, *range(1, len(stream))]


@pytest.mark.parametrize("strip", [False, True])
def test_done_is_seen_only_at_the_start_of_a_line(strip: bool) -> None:
    stream = ROLE + TOKEN + FINISH + DONE
    for cut in cuts(stream):
        watch = StreamWatch(strip_usage=strip)
        assert feed(watch, stream, cut) == stream
        assert watch.done, cut
    for cut in cuts(ROLE + TOKEN):  # the text `data: [DONE]` inside content is no end
        watch = StreamWatch(strip_usage=strip)
        feed(watch, ROLE + TOKEN, cut)
        assert not watch.done, cut


def test_the_usage_chunk_is_held_back_with_its_blank_line_and_counted() -> None:
    for ending in (b"\n", b"\r\n", b"\r"):
        usage = USAGE.replace(b"\n", ending)
        stream = ROLE + TOKEN + FINISH + usage + DONE
        for cut in cuts(stream):
            watch = StreamWatch(strip_usage=True)
            assert feed(watch, stream, cut) == ROLE + TOKEN + FINISH + DONE, cut
            assert watch.usage == COUNTS and watch.done


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_a_held_back_usage_chunk_goes_with_its_whole_event(ending: bytes) -> None:
    """A usage chunk after an `event:` line (an `id:` line, a comment) in its event: the
    whole event is held back, so none of its fields is left to join the next event the
    client reads (which the SDK then read under the held-back event's name)."""
    stream = (ROLE + b"event: usage\nid: 7\n: note\n" + USAGE + FINISH + DONE).replace(
        b"\n", ending
    )
    shown = (ROLE + FINISH + DONE).replace(b"\n", ending)
    for cut in cuts(stream):
        watch = StreamWatch(strip_usage=True)
        assert feed(watch, stream, cut) == shown, cut
        assert watch.usage == COUNTS and watch.done, cut
    events = list(SSEDecoder().iter_bytes(iter([shown])))
    assert len(events) == 3 and all(event.event is None for event in events)


@pytest.mark.parametrize("strip", [False, True])
@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("done", [b"data: [DONE]", b"data:[DONE]"])
def test_done_ends_a_stream_whatever_its_line_ends(strip: bool, ending: bytes, done: bytes) -> None:
    """`data: [DONE]` after a line ended in LF, CRLF or a bare CR (the SSE grammar's three)
    ends the stream, however the reads cut it; a CR-only stream's usage chunk is held back
    in strip mode, and nothing else is held (the relayed bytes keep up with the reads)."""
    events = ROLE + TOKEN + FINISH + USAGE
    stream = events.replace(b"\n", ending) + done + ending * 2
    shown = (ROLE + TOKEN + FINISH if strip else events).replace(b"\n", ending) + done + ending * 2
    for cut in cuts(stream):
        watch = StreamWatch(strip_usage=strip)
        assert feed(watch, stream, cut) == shown, cut
        assert watch.done and watch.usage == COUNTS, cut
    watch = StreamWatch(strip_usage=strip)
    first = (ROLE + TOKEN).replace(b"\n", ending)
    assert watch.feed(first) == first  # whole lines without usage: none held back
    assert not watch.done


def test_without_strip_every_byte_goes_through() -> None:
    stream = ROLE + FINISH + USAGE + DONE
    watch = StreamWatch(strip_usage=False)
    for cut in cuts(stream):
        watch = StreamWatch(strip_usage=False)
        assert feed(watch, stream, cut) == stream
        assert watch.usage == COUNTS, cut  # the counts the client is shown, for the record


def test_usage_on_a_chunk_with_choices_is_counted_and_kept() -> None:
    finish_with_usage = FINISH[:-3] + b',"usage":{"prompt_tokens":7,"completion_tokens":2,'
    finish_with_usage += b'"total_tokens":9}}\n\n'
    watch = StreamWatch(strip_usage=True)
    assert feed(watch, finish_with_usage + DONE, None) == finish_with_usage + DONE
    assert watch.usage == COUNTS


def test_a_long_line_is_passed_on_not_held() -> None:
    long = b'data: {"choices":[{"delta":{"content":"' + b"x" * 5000 + b'"}}]}\n\n'
    watch = StreamWatch(strip_usage=True, max_line=1024)
    out = [watch.feed(long[i : i + 100]) for i in range(0, len(long), 100)]
    assert b"".join(out) + watch.feed(USAGE) + watch.flush() == long
    assert max(len(piece) for piece in out) <= 1024 + 100  # never more than that held
    # The long event went on unread: a usage in it is one the client may have been shown
    # and the gateway did not read, so the usage is unknown (charged the byte estimate).
    assert watch.usage is None and watch.events.unknown


@pytest.mark.parametrize(
    ("sent", "options"),
    [
        (b' {"model":"m","stream":true}', None),
        (b'{"model":"m","stream":true,"stream_options":{"include_usage":false}}', {}),
        (b'{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}', {}),
        (b'{"model":"m","stream":true,"stream_options":null}', {}),
    ],
)
def test_ask_for_usage(sent: bytes, options: dict[str, object] | None) -> None:
    doc = orjson.loads(sent)
    out = ask_for_usage(sent, doc)
    got = orjson.loads(out)
    assert got["stream_options"]["include_usage"] is True
    assert {k: v for k, v in got.items() if k != "stream_options"} == {
        k: v for k, v in doc.items() if k != "stream_options"
    }
    if options is None:  # spliced: every other byte as sent
        assert out == b' {"stream_options":{"include_usage":true},' + sent[2:]
    else:
        old = doc["stream_options"] or {}
        assert got["stream_options"] == {**old, "include_usage": True}


_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _event_by_event(stream: bytes, max_line: int) -> bytes:
    """What strip mode relays, read from the whole stream event by event (the reference
    the read-by-read scan must equal however the reads cut it): lines end in LF, CRLF or
    CR, an empty line ends an event, and an event (its last one too, unended) of at most
    `max_line` bytes whose `data:` lines join to a usage-only chunk is dropped whole."""
    shown: list[bytes] = []
    event = b""
    for line in _LINE.findall(stream):
        event += line
        if line in (b"\n", b"\r\n", b"\r"):
            shown.append(b"" if _usage_only(event, max_line) else event)
            event = b""
    shown.append(b"" if _usage_only(event, max_line) else event)
    return b"".join(shown)


def _usage_only(event: bytes, max_line: int) -> bool:
    if len(event) > max_line:
        return False
    lines = re.split(rb"\r\n|\r|\n", event)
    data = [line[5:].removeprefix(b" ") for line in lines if line.split(b":")[0] == b"data"]
    try:
        doc = json.loads(b"\n".join(data)) if data else None
    except ValueError:
        return False
    if not isinstance(doc, dict) or doc.get("choices") != []:
        return False
    usage = doc.get("usage")
    return isinstance(usage, dict) and all(type(usage.get(name, 0)) is int for name in COUNTS)


_PARTS = [
    ROLE,
    TOKEN,
    FINISH,
    USAGE,
    USAGE.replace(b"\n\n", b"\r\n\r\n"),
    USAGE.replace(b"\n", b"\r"),  # CR line ends
    FINISH.replace(b"\n", b"\r"),
    b"data:[DONE]\r\r",
    b"\r",
    USAGE.replace(b"[]", b'[{"index":0,"delta":{}}]'),  # usage beside choices: kept
    USAGE[:-1],  # a usage chunk whose event has no blank line after it
    b'data: {"usage": 1}\n\n',  # not usage counts: kept
    b': a comment about "usage"\n',
    b"\n",
    DONE,
    b"data: [DONE]",  # a last line without its newline
    b"x" * 270 + b'"usage"' + b"y" * 10 + b"\n",  # a long line (max_line 256 below)
    b"event: chunk\n",  # a field line that starts the event the next part goes on
    b"event: usage\r\nid: 7\r\n" + USAGE.replace(b"\n", b"\r\n"),
    b": ping\n" + USAGE,  # a comment inside the usage chunk's event
    b"event: x\n" + USAGE[:-1],  # named, and no blank line after it
    b": " + b"p" * 300 + b"\n",  # an event let go past max_line
    USAGE.replace(b'"choices":', b'"choices":\ndata: '),  # the chunk over two data lines
    USAGE[:-1] + TOKEN,  # a usage line and a token in one event: not usage-only
]


@given(
    st.lists(st.sampled_from(_PARTS), max_size=12),
    st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
@settings(max_examples=600, deadline=None)
def test_the_usage_scan_equals_the_event_by_event_one(parts: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(parts)
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    reads = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    watch = StreamWatch(strip_usage=True, max_line=64 * 4)
    out = b"".join(watch.feed(read) for read in reads) + watch.flush()
    assert out == _event_by_event(stream, 64 * 4)
    assert watch.done == (re.search(rb"(?:\A|[\r\n])data: ?\[DONE\]", out) is not None)


def test_many_events_in_one_read_with_the_usage_chunk_last() -> None:
    stream = ROLE + TOKEN * 200 + FINISH + USAGE + DONE
    watch = StreamWatch(strip_usage=True)
    assert watch.feed(stream) + watch.flush() == ROLE + TOKEN * 200 + FINISH + DONE
    assert watch.done and watch.usage == COUNTS


OTHER = USAGE.replace(b'"prompt_tokens":7', b'"prompt_tokens":8')
_SHOWN = [
    ROLE,
    TOKEN,
    USAGE,
    OTHER.replace(b"\n", b"\r"),  # CR line ends
    OTHER.replace(b"\n", b"\r\n").replace(b"data: ", b"data:"),  # CRLF, no space
    USAGE.replace(b"[]", b'[{"index":0,"delta":{}}]'),  # usage beside choices
    b'data: {"usage": 1}\n\n',  # not usage counts
    OTHER.replace(b'"total_tokens":9', b'"total_tokens":"9"'),  # a string: no counts
    OTHER.replace(b',"total_tokens":9', b""),  # a count left out: 0
    OTHER.replace(b'"prompt_tokens":8', b'"prompt_tokens":0'),  # zero is a count
    OTHER.replace(b"}}", b',"x":NaN}}'),  # NaN: orjson refuses, the client's json reads
    b': a comment about "usage"\n',
    b": keep-alive\n\n" * 3,
    DONE,
    USAGE[:-2],  # a usage line left open (the stream's last, at best)
    # One usage chunk over several `data:` lines (the SDK joins them with LF), and two
    # usage documents in one event (their join does not parse: none shown).
    OTHER.replace(b'"choices":', b'"choices":\ndata: ').replace(b'"usage":', b'\ndata:"usage":'),
    OTHER.replace(b"\n\n", b"\r\n").replace(b'"choices":', b'"choices":\rdata: ') + b"\r\n",
    USAGE[:-1] + OTHER,
    b'data: {"id":"c",\n: a comment inside the event\nid: 3\n'
    b'data: "usage":{"prompt_tokens":5}}\n\n',
    b'data: {"\\u0075sage":{"prompt_tokens":6}}\n\n',  # an escaped key is a key
    b'data: {"error":{"message":"boom","code":"x"}}\n\n',  # the SDK raises: no further
    b'data: {"error":null}\n\n',  # no error to the SDK
]


def _shown_usage(stream: bytes) -> dict[str, int] | None:
    """The last usage counts the OpenAI SDK's own SSE decoder (openai/_streaming.py)
    shows for the stream as the client gets it (the gateway's receipt line after it, a
    line end first when it ends mid-line): events up to `[DONE]` or an error event, each
    event's `data` lines joined as the SDK joins them, read with the standard library's
    parser, up to an event whose data is not JSON (the SDK raises there: every such
    event here holds a usage, so the reader parses it; gateway/api/sse_events.py); the
    three counts, integers where present, absent ones 0 (none when the last usage shown
    is no object or its counts are not all integers: the record states none then,
    docs/provenance.md)."""
    suffix = b"\n" if stream and stream[-1:] not in (b"\n", b"\r") else b""
    found = None
    for event in SSEDecoder().iter_bytes(iter([stream + suffix + b": owngate-receipt x\n\n"])):
        if event.data.startswith("[DONE]"):
            break
        try:
            doc = json.loads(event.data)
        except ValueError:
            break
        if isinstance(doc, dict) and doc.get("error"):
            break
        usage = doc.get("usage") if isinstance(doc, dict) else None
        if isinstance(usage, dict):
            counts = {name: usage.get(name, 0) for name in COUNTS}
            # a last usage object without integer counts is none, never an earlier one
            found = counts if all(type(v) is int for v in counts.values()) else None
        elif usage is not None:  # `"usage": 7`: `chunk.usage` is 7, no counts: none
            found = None
    return found


@given(
    st.lists(st.sampled_from(_SHOWN), max_size=12),
    st.lists(st.integers(min_value=0, max_value=600), max_size=8),
)
@settings(max_examples=400, deadline=None)
def test_usage_the_client_asked_for_is_noted_wherever_it_is(
    parts: list[bytes], cuts: list[int]
) -> None:
    """Without strip (the client asked for usage), every byte goes through as it came,
    and the counts noted are the last the client was shown before `[DONE]`, however the
    reads cut the stream, whatever its line ends, and however much follows them (the
    record's usage)."""
    stream = b"".join(parts)
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    reads = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    watch = StreamWatch(strip_usage=False)
    assert b"".join(watch.feed(read) for read in reads) + watch.flush() == stream
    watch.end()
    assert watch.usage == _shown_usage(stream)


def test_an_open_event_past_max_line_is_let_go() -> None:
    """An event that stays open past `max_line` bytes is not kept (no usage chunk is that
    long): what is held stays bounded, and the next events are read again."""
    watch = StreamWatch(strip_usage=False, max_line=64)
    long = b'data: {"usage":' + b"x" * 100
    for piece in (long[:50], long[50:], b"y" * 1000, b"\ndata: 1\n", b": z" * 100):
        watch.feed(piece)
        assert len(watch.events._raw) <= 64
    assert watch.feed(b"\n\n" + USAGE) and watch.usage == COUNTS
    assert len(watch.events._raw) == 0


def test_a_read_of_whole_lines_is_not_scanned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Hot path, the client asked for usage: a read of whole lines after one that ended a
    # line is passed with a search for `[DONE]`: no tail joined and searched, no line scan
    # (the event reader parses each `data:` line's value, split out by one split).
    scanned: list[list[bytes]] = []
    read_lines, see = EventReader._read, StreamWatch._see_done

    def reading(reader: EventReader, lines: list[bytes], *, dispatch: bool) -> None:
        scanned.append(lines)
        read_lines(reader, lines, dispatch=dispatch)

    def seeing(watch: StreamWatch, data: bytes) -> None:
        scanned.append([data])
        see(watch, data)

    monkeypatch.setattr(EventReader, "_read", reading)
    monkeypatch.setattr(StreamWatch, "_see_done", seeing)
    watch = StreamWatch(strip_usage=False)
    token = TOKEN.replace(b"data: [DONE]", b"hi")
    for read in (ROLE, *[token] * 8, FINISH, USAGE, DONE):
        assert watch.feed(read) == read
    assert watch.flush() == b""
    assert scanned == []
    assert watch.done and watch.usage == COUNTS


_ENDED = [
    ROLE,
    TOKEN,  # `data: [DONE]` inside a JSON string: no end
    USAGE,
    DONE,
    b"data:[DONE]\r\n\r\n",
    DONE.replace(b"\n", b"\r"),
    b": data: [DONE]\n",  # a comment: no end
    b"xdata: [DONE]\n",  # not at a line start: no end
    b"data: [DONE",  # cut short
    b"x",  # a line the next part goes on
    b"y" * 100,  # ... past `max_line`: let go, not kept open
    TOKEN.replace(b"\n", b"\r"),
]


@given(
    st.lists(
        st.tuples(st.sampled_from(_ENDED), st.integers(min_value=0, max_value=120)),
        max_size=10,
    ),
    st.lists(st.booleans(), max_size=20),
    st.booleans(),
)
@settings(max_examples=600, deadline=None)
def test_done_is_what_a_line_by_line_reading_finds_however_the_reads_cut(
    parts: list[tuple[bytes, int]], joins: list[bool], strip: bool
) -> None:
    # Reads cut inside a part, at its edges, or holding several parts.
    pieces = [piece for part, at in parts for piece in (part[:at], part[at:]) if piece]
    reads: list[bytes] = []
    for index, piece in enumerate(pieces):
        if reads and index < len(joins) and joins[index]:
            reads[-1] += piece
        else:
            reads.append(piece)
    stream = b"".join(reads)
    watch = StreamWatch(strip_usage=strip, max_line=64)
    for read in reads:
        watch.feed(read)
    watch.flush()
    ends = re.search(rb"(?:\A|[\r\n])data: ?\[DONE\]", stream) is not None
    assert watch.done == ends


def test_the_rest_of_a_line_let_go_starts_no_line() -> None:
    """A comment line past `max_line`, whose rest comes in a read starting `data: {...
    "usage"...}`: all of it is one comment to the client, so no counts are noted; the
    next line is read again."""
    watch = StreamWatch(strip_usage=False, max_line=64)
    for opened in (b": " + b"p" * 100, b": " + b"p" * 50):  # let go at once, or grown
        watch.feed(opened)
    watch.feed(b"p" * 30)
    watch.feed(OTHER)
    assert watch.usage is None
    watch.feed(USAGE)
    assert watch.usage == COUNTS


@pytest.mark.parametrize("strip", [False, True])
def test_usage_after_done_is_not_noted(strip: bool) -> None:
    """The SDKs read no event after `[DONE]`: usage after it is none the client saw (a
    usage-only chunk there is still held back from a client that did not ask)."""
    stream = ROLE + USAGE + DONE + OTHER
    for cut in cuts(stream):
        watch = StreamWatch(strip_usage=strip)
        shown = feed(watch, stream, cut)
        assert watch.usage == COUNTS, cut
        assert shown == (ROLE + DONE if strip else stream), cut


@pytest.mark.parametrize("cut", [0, 5, 16, 17, 30])
def test_a_thread_event_shows_no_usage_however_the_reads_cut(cut: int) -> None:
    """The SDK's legacy `Stream` nests a `thread.*` event's data under "data"."""
    big = b'{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}'
    small = b'{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}'
    stream = (
        b'data: {"choices":[],"usage":'
        + small
        + b"}\n\n"
        + b'event: thread.x\ndata: {"choices":[],"usage":'
        + big
        + b"}\n\n"
        + b'event: thread.x\ndata: {"error":{"message":"x"}}\n\n'
    )
    first = stream.index(b"event:")
    reader = EventReader()
    reader.feed(stream[: first + cut])
    reader.feed(stream[first + cut :])
    reader.finish()
    assert reader.usage == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert not reader.error_event and not reader.stopped


@given(
    st.lists(st.sampled_from(_PARTS), max_size=12),
    st.lists(st.integers(min_value=0, max_value=400), max_size=6),
    st.booleans(),
)
@settings(max_examples=400, deadline=None)
def test_without_find_done_only_done_differs(
    parts: list[bytes], cuts: list[int], strip: bool
) -> None:
    # A framed body (chunked, or with a length) says where it ends: the relay does not
    # search its reads for `[DONE]`, and nothing else it relays or notes changes.
    stream = b"".join(parts)
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    reads = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    seeking = StreamWatch(strip_usage=strip, max_line=64)
    framed = StreamWatch(strip_usage=strip, find_done=False, max_line=64)
    for read in reads:
        assert framed.feed(read) == seeking.feed(read)
    assert framed.flush() == seeking.flush()
    assert framed.usage == seeking.usage
    assert not framed.done


_CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":'
_ROLE = _CHUNK + b'[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
_USAGE_7 = _CHUNK + b'[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}\n\n'
_USAGE_1 = _CHUNK + b'[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
_ERROR = b'data: {"error":{"message":"boom"}}\n\n'


def _stripped(reads: list[bytes], find_done: bool) -> tuple[bytes, StreamWatch]:
    watch = StreamWatch(strip_usage=True, find_done=find_done)
    out = b"".join(watch.feed(read) for read in reads) + watch.flush()
    watch.end()
    return out, watch


@pytest.mark.parametrize("find_done", [True, False])
def test_a_usage_chunk_after_done_split_from_its_blank_line_is_not_held(
    find_done: bool,
) -> None:
    """A framed body is not searched for `[DONE]` (`find_done=False`), yet a usage chunk
    after it (the marker's blank line in the next read) is no usage the client saw."""
    out, watch = _stripped([_ROLE, _USAGE_7, b"data: [DONE]\n", b"\n" + _USAGE_1], find_done)
    assert out == _ROLE + b"data: [DONE]\n\n"
    assert watch.usage == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


@pytest.mark.parametrize("find_done", [True, False])
@pytest.mark.parametrize("cut", [None, len(_ROLE + _ERROR)])
def test_a_usage_chunk_after_an_error_event_is_held_the_same_however_cut(
    find_done: bool, cut: int | None
) -> None:
    """The SDK raises at the backend's error event and reads nothing after it: a usage
    chunk there is not recorded, whether or not it came in the error event's read (it
    was when it did: the event reader learnt of the error only after the read)."""
    stream = _ROLE + _ERROR + _USAGE_7
    reads = [stream] if cut is None else [stream[:cut], stream[cut:]]
    _, watch = _stripped(reads, find_done)
    assert watch.error_event
    assert watch.usage is None


@pytest.mark.parametrize("strip", [False, True])
def test_an_event_let_go_past_its_bound_makes_the_usage_unknown(strip: bool) -> None:
    """An event over `max_line` that grows across reads is not read (its memory is
    bounded); the client's SDK reads it whole, with the usage it may hold. The record
    kept the earlier, smaller usage (found by review): now it states none, and the
    tenant is charged the byte estimate."""
    big = _CHUNK + b'[],"pad":"' + b"x" * 200 + b'","usage":' + json.dumps(COUNTS).encode()
    stream = _USAGE_1 + big + b"}\n\n" + DONE
    watch = StreamWatch(strip_usage=strip, max_line=64)
    for at in range(0, len(stream), 16):  # read by read, as a paced backend sends
        watch.feed(stream[at : at + 16])
    watch.flush()
    watch.end()
    assert watch.usage is None
    assert watch.events.unknown


def test_a_thread_event_s_usage_chunk_is_not_held_back() -> None:
    """The SDK hands a `thread.*` event on nested, reading no usage from it: strip mode
    lets it go on to the client and records none of its counts (it held it back and
    recorded them)."""
    event = b'event: thread.run\ndata: {"choices":[],"usage":' + json.dumps(COUNTS).encode()
    stream = _ROLE + event + b"}\n\n" + DONE
    out, watch = _stripped([stream], find_done=True)
    assert out == stream
    assert watch.usage is None
