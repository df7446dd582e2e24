"""A paced server's usual read, one `data: {` line and its blank line, is tested once by
the relay (`sse_events.one_data_line`) and then not fed to the comment filter, nor
searched by the stream watch for what that line cannot hold (gateway/api/stream_relay.py):
whatever came before, the client gets the same bytes and the record the same usage."""

from __future__ import annotations

import json

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from gateway.api.sse import StreamWatch
from gateway.api.sse_events import one_data_line
from gateway.sse_comments import CommentFilter

USAGE = b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
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


def _relay(
    reads: list[bytes], *, strip: bool, fast: bool, not_json: list[bytes] | None = None
) -> tuple[object, ...]:
    """What the client got and what the record says; `not_json` collects the reads taken
    as one data line whose data is not JSON."""
    comments = CommentFilter()
    watch = StreamWatch(strip_usage=strip, find_done=True)
    out = []
    for data in reads:
        if fast and comments.clean and one_data_line(data):  # the relay's sink
            if not_json is not None and not _json(data[6:-2]):
                not_json.append(data)
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


def _json(value: bytes) -> bool:
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None)
# A one-line read whose data is not JSON and holds `[DONE]`: the full filters parse it
# (the SDK raises there, reading no further), the one-line read does not (as `data: {x`
# is not parsed): its usage after it differed, when the draw made one (reviewG).
@example(
    reads=[PIECES[0], b"data: {data: [DONE]\n\n", b"data: {" + USAGE[1:] + b"\n\n"],
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
    not_json: list[bytes] = []
    fast = _relay(reads, strip=strip, fast=True, not_json=not_json)
    # One whose data is not JSON is read as any event without a needle (not parsed:
    # test_a_one_line_read_whose_data_is_not_json_is_not_parsed_whatever_it_holds).
    assume(not not_json)
    assert fast == _relay(reads, strip=strip, fast=False)


def test_a_one_line_read_whose_data_is_not_json_is_not_parsed_whatever_it_holds() -> None:
    # The known limit (docs/provenance.md): `data: {x` is not parsed (the SDK raises
    # there); nor is `data: {x [DONE]` or `data: {x id: 1` read alone, unlike in a read
    # of more lines, which is searched for them and parsed.
    for line in [b"data: {x", b"data: {x [DONE]", b"data: {x id: 1", b"data: {x event: e"]:
        usage = [b"data: {" + USAGE[1:] + b"\n\n"]
        alone = _relay([PIECES[0], line + b"\n\n", *usage], strip=False, fast=True)
        assert alone[5] is False and alone[1] is not None, line  # not stopped at: counted
        after = _relay([PIECES[0] + line + b"\n\n", *usage], strip=False, fast=True)
        assert after[5] is (line != b"data: {x"), line  # searched for them: parsed


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
