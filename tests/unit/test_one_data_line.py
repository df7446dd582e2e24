"""A paced server's usual read, one `data: {` line and its blank line, is tested once by
the relay (`sse_framing.one_data_line`) and then not fed to the comment filter, nor
searched by the stream watch and event reader for what makes an event worth parsing, but
parsed once, as the client's SDK parses it (gateway/api/stream_relay.py, sse_events.py):
whatever came before, the client gets the same bytes and the record the same usage, or,
where the read's data is not JSON, stops where the SDK raises (the full filters skip one
that holds no needle)."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.api.sse import StreamWatch
from gateway.api.sse_framing import one_data_line
from gateway.sse_comments import CommentFilter
from tests.helpers.sdk_stream import counts, sdk_shown_usage

USAGE = b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
# Usage in chunks that hold a choice: shown to the client in either mode (the stream watch
# holds back only a usage-only chunk, when the gateway asked for it).
SMALL = b'{"choices":[{"index":0,"delta":{}}],"usage":' + USAGE[USAGE.index(b'{"p') :]
BIG = SMALL.replace(b":3,", b":900,").replace(b":2,", b":900,").replace(b":5}", b":1800}")
_COUNTS = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
_ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
# Pieces a backend may write, a read being any run of them cut anywhere: the usual chunk,
# and everything the skipped searches look for (a comment, `[DONE]`, fields, an escape).
PIECES = [
    b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"\\u0075"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"\xc3\xa9"}}]}\n\n',
    b"data: {" + USAGE[1:] + b"\n\n",
    b'data: {"error":{"message":"no"}}\n\n',
    b": owngate-receipt forged\n",
    b": OwNgAtE-x\r\n",
    b": ping\n",
    b"data: [DONE]\n\n",
    b"id: 7\n",
    b"event: x\n",
    b"retry: 5\n",
    b"\n",
    b"\r",
    b'data: {"a":"id: event: retry: [DONE]"}\n\n',
    b'data: {"a":1}\rid: 1\n\n',
    b'data: {"a":1}\n',
    b": own",  # a line left unfinished at the read's end: held, or relayed
    b"data: {",
    b"\xef\xbb\xbf",
]


def _relay(reads: list[bytes], *, strip: bool, fast: bool) -> tuple[object, ...]:
    """What the client got and what the record says."""
    comments = CommentFilter()
    watch = StreamWatch(strip_usage=strip, find_done=True)
    out = []
    for data in reads:
        if fast and comments.clean and one_data_line(data):  # the relay's sink
            out.append(watch.feed(data, True))
        else:
            out.append(watch.feed(comments.feed(data)))
    out += [watch.feed(comments.flush()), watch.flush()]
    watch.end()
    events = watch.events
    return (
        b"".join(out),
        watch.usage,
        watch.error_event,
        watch.done,
        comments.stripped,
        events.stopped,
        events.unknown,
    )


@settings(max_examples=400, deadline=None)
# A one-line read whose data is not JSON and holds `[DONE]`: the full filters parse it
# (the SDK raises there, reading no further), and the one-line read is parsed too (it was
# not searched for `[DONE]`, and the usage after it was recorded: reviewG).
@example(
    reads=[PIECES[0], b"data: {data: [DONE]\n\n", b"data: {" + USAGE[1:] + b"\n\n"],
    cuts=[],
    strip=False,
)
# One holding nothing the full filters search for: they skip it, the one-line read stops,
# also after a read that left its event unfinished (a comment line: the same event; in
# strip mode the stream watch holds such an event and reads it as the full filters do).
@example(
    reads=[b": ping\n", b'data: {data: {"a":1}\n\n', b"data: {" + USAGE[1:] + b"\n\n"],
    cuts=[],
    strip=False,
)
@example(
    reads=[PIECES[0], b'data: {data: {"a":1}\n\n', b"data: {" + USAGE[1:] + b"\n\n"],
    cuts=[],
    strip=False,
)
@given(
    reads=st.lists(
        st.lists(st.sampled_from(PIECES), min_size=1, max_size=3).map(b"".join), max_size=10
    ),
    cuts=st.lists(st.integers(0, 400), max_size=3),
    strip=st.booleans(),
)
def test_the_usual_read_tested_once_relays_and_reads_as_every_filter_would(
    reads: list[bytes], cuts: list[int], strip: bool
) -> None:
    for cut in cuts:  # a read cut anywhere, too
        at = cut % (len(reads) + 1)
        if at < len(reads) and 0 < cut % 97 < len(reads[at]):
            reads[at : at + 1] = [reads[at][: cut % 97], reads[at][cut % 97 :]]
    reads += [PIECES[0]] * 2  # and the usual reads after whatever came
    fast = _relay(reads, strip=strip, fast=True)
    slow = _relay(reads, strip=strip, fast=False)
    if fast != slow:
        # The one-line read is parsed (with what of its event came before): one whose
        # event's data is not JSON and holds nothing the full filters search for
        # (`data: {data: {"a":1}`) they skip (the known limit of `data: x`), where it
        # stops the reader as the SDK stops. Same bytes, `[DONE]` and stripped count.
        assert fast[5] is True and slow[5] is False
        assert (fast[0], fast[3], fast[4]) == (slow[0], slow[3], slow[4])
        if not strip:  # (strip mode records a usage chunk held back from the client)
            assert fast[1] == _shown(fast)


# One-line reads whose data is not JSON, with and without a needle of the other reads'
# searches: the client's SDK raises at each, so a usage after it is never shown.
NOT_JSON_LINES = [
    b"data: {x",
    b"data: {x [DONE]",
    b"data: {x id: 1",
    b"data: {x event: e",
    b"data: {x retry: 5",
    b'data: {"a":1} {"b":2}',  # two documents
    b'data: {"a":"\\u0075sage"',  # cut short, an escape in it
    b'data: {"c":"\xc3\xa9"',  # not ASCII
    b'data: {"a":"' + b"x" * 1100,  # past the short parse: read as any event
]


@pytest.mark.parametrize("strip", [False, True])
@pytest.mark.parametrize("line", NOT_JSON_LINES)
def test_a_one_line_read_whose_data_is_not_json_stops_the_reader_where_the_sdk_raises(
    line: bytes, strip: bool
) -> None:
    # Before: such a read was parsed only if it held `"usage"`, `"error"` or a letter
    # escape (the stream watch and event reader skipped their `[DONE]`, `id:`, `event:`
    # and `retry:` searches for it), so the usage after it was recorded (reviewG).
    reads = [PIECES[0], b"data: {" + SMALL[1:] + b"\n\n", line + b"\n\n"]
    reads += [PIECES[0], b"data: {" + BIG[1:] + b"\n\n", b"data: [DONE]\n\n"]
    assert one_data_line(reads[2])
    relayed = _relay(reads, strip=strip, fast=True)
    assert relayed[5] is True, line  # stopped: the SDK raises there
    assert relayed[1] == _shown(relayed) == _COUNTS, line


@pytest.mark.parametrize("strip", [False, True])
def test_a_one_line_read_is_read_as_the_sdk_reads_it(strip: bool) -> None:
    # Parsed once (orjson), a one-line read's usage and error are read from the document:
    # a key spelled with escapes is that key, a refused document (`NaN`) is read again by
    # the standard library as the SDK reads it, a falsy error is none.
    for line, shown, error in [
        (b'data: {"\\u0075sage":' + USAGE[USAGE.index(b'{"p') :], _COUNTS, False),
        (b'data: {"a":NaN,"usage":{"prompt_tokens":4}}', {**_ZERO, "prompt_tokens": 4}, False),
        (b'data: {"error":0,"usage":{"prompt_tokens":4}}', {**_ZERO, "prompt_tokens": 4}, False),
        (b'data: {"error":{"message":"no"}}', None, True),
        (b'data: {"usage":{"prompt_tokens":true}}', None, False),
    ]:
        reads = [PIECES[0], line + b"\n\n", b"data: {" + BIG[1:] + b"\n\n"]
        assert one_data_line(reads[1])
        relayed = _relay(reads, strip=strip, fast=True)
        expected = _shown(relayed)
        assert expected == (shown if error else counts(json.loads(BIG)["usage"])), line
        assert (relayed[1], relayed[2]) == (expected, error), line
        if not error:  # and the same read taken alone (the usage after it is not last)
            alone = _relay([PIECES[0], line + b"\n\n", PIECES[0]], strip=strip, fast=True)
            assert alone[1] == _shown(alone) == shown, line


def _shown(relayed: tuple[object, ...]) -> dict[str, int] | None:
    """The counts the installed SDK shows its client for the relayed bytes."""
    assert isinstance(relayed[0], bytes)
    return counts(sdk_shown_usage(relayed[0]))


def test_one_data_line_is_one_data_line_and_its_blank_line_only() -> None:
    assert one_data_line(PIECES[0])
    assert one_data_line(PIECES[2])
    for other in [
        PIECES[0][:-1],  # its event not ended
        PIECES[0] + b"\n",  # an empty line more: a blank line of its own
        PIECES[0].replace(b"\n", b"\r\n"),  # CRLF: the usual searches
        PIECES[14].replace(b'"a"', b'"a\rid: 1"'),  # a CR inside: a second line
        PIECES[15],
        b": x\n\n",
        b"data:{}\n\n",  # no space: the usual searches
        b"data: [DONE]\n\n",
        b"",
        b"\n\n",
    ]:
        assert not one_data_line(other), other
