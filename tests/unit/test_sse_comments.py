"""`CommentFilter` (gateway/sse_comments.py): a backend's `owngate-` SSE comment lines
never reach a client, however the stream is split into reads; every other byte does.

The expected output is what an SSE parser (WHATWG event-stream grammar: lines end in LF,
CRLF or CR, a comment starts with `:`, a BOM may open the stream) reads, less the
comment lines whose text starts with `owngate-`, in any ASCII case, after spaces and tabs.
"""

from __future__ import annotations

import asyncio
import re
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.log_tally import Tally
from gateway.sse_comments import CommentFilter, without_comments, without_comments_in_turns
from gateway.upstream.openai_wire import encode_chunk
from tests.helpers.loop_turns import with_turns_beside

_EVENT = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
_DONE = b"data: [DONE]\n\n"

# (backend stream, what the client must get)
CASES = {
    "receipt": (_EVENT + b": owngate-receipt X\n\n" + _DONE, _EVENT + b"\n" + _DONE),
    "no-space": (_EVENT + b":owngate-attest Y\n" + _DONE, _EVENT + _DONE),
    "tab-blanks": (b":\t owngate-receipt Z\n" + _DONE, _DONE),
    "crlf": (
        b"data: a\r\n: owngate-receipt X\r\ndata: b\r\n\r\n",
        b"data: a\r\ndata: b\r\n\r\n",
    ),
    "cr": (b"data: a\r: owngate-receipt X\rdata: b\r\r", b"data: a\rdata: b\r\r"),
    "first-line": (b": owngate-receipt X\n" + _DONE, _DONE),
    # A client parser may match the prefix without regard to case: any case is removed.
    "upper-case": (_EVENT + b": OWNGATE-receipt X\n\n" + _DONE, _EVENT + b"\n" + _DONE),
    "mixed-case": (_EVENT + b":\tOwnGate-Attest Y\r\n" + _DONE, _EVENT + _DONE),
    "upper-unended": (_EVENT + b": OWNG", _EVENT),
    "after-bom": (b"\xef\xbb\xbf: owngate-receipt X\n" + _DONE, _DONE),
    "unended": (_EVENT + b": owngate-receipt X", _EVENT),
    "unended-prefix": (_EVENT + b": owng", _EVENT),
    "ping-untouched": (
        b": ping\n\n" + _EVENT + b":\n" + _DONE,
        b": ping\n\n" + _EVENT + b":\n" + _DONE,
    ),
    "not-a-comment": (
        b'data: ": owngate-receipt X"\n\n data: owngate-x\nx: owngate-y\n',
        b'data: ": owngate-receipt X"\n\n data: owngate-x\nx: owngate-y\n',
    ),
    "near-misses": (
        b": owngate\n: owngateX\n:: owngate-x\n: own gate-x\n: OWNGATE_x\n",
        b": owngate\n: owngateX\n:: owngate-x\n: own gate-x\n: OWNGATE_x\n",
    ),
    "mid-line": (b"data: x: owngate-receipt X\n", b"data: x: owngate-receipt X\n"),
    # Any line may be the first the client gets (a usage chunk before it held back, in
    # gateway/api/sse.py): behind a BOM anywhere, removed (elsewhere it is an unknown
    # field, which a parser ignores).
    "bom-anywhere": (
        b"data: a\n\xef\xbb\xbf: owngate-x\n",
        b"data: a\n",
    ),
    "bom-line-that-is-no-comment-kept": (
        b"data: a\n\xef\xbb\xbfdata: b\n\xef\xbb\xbf\n\xef\xbc\x9a owngate-x\n",
        b"data: a\n\xef\xbb\xbfdata: b\n\xef\xbb\xbf\n\xef\xbc\x9a owngate-x\n",
    ),
    # A removed line is no byte the client gets: the line after it opens the client's
    # stream, where its parser skips a BOM and reads the comment behind it.
    "bom-after-a-removed-line": (
        b": owngate-x\n\xef\xbb\xbf: owngate-receipt X\n" + _DONE,
        _DONE,
    ),
    "bom-after-removed-lines": (
        b": owngate-x\r\n:OWNGATE-y\r\xef\xbb\xbf:\towngate-attest Y\n" + _DONE,
        _DONE,
    ),
    "bom-after-a-removed-line-kept-when-no-comment": (
        b": owngate-x\n\xef\xbb\xbfdata: a\n\n",
        b"\xef\xbb\xbfdata: a\n\n",
    ),
}


def _relay(stream: bytes, cuts: list[int]) -> tuple[bytes, int]:
    comments = CommentFilter()
    out, previous = [], 0
    for cut in [*sorted(cuts), len(stream)]:
        out.append(comments.feed(stream[previous:cut]))
        previous = cut
    out.append(comments.flush())
    return b"".join(out), comments.stripped


@pytest.mark.parametrize("name", CASES)
def test_each_case_at_every_split_position(name: str) -> None:
    stream, expected = CASES[name]
    assert _relay(stream, []) == (expected, _relay(stream, [])[1])
    for cut in range(len(stream) + 1):
        assert _relay(stream, [cut])[0] == expected, cut
    for first in range(len(stream) + 1):  # two splits: every pair for short streams
        for second in range(first, min(len(stream), first + 24) + 1):
            assert _relay(stream, [first, second])[0] == expected, (first, second)


@pytest.mark.parametrize("cut", range(len(b": owngate-receipt X\n") + 1))
def test_a_receipt_split_at_any_byte_is_removed_and_counted(cut: int) -> None:
    stream = _EVENT + b": owngate-receipt X\n" + _DONE
    out, stripped = _relay(stream, [len(_EVENT) + cut])
    assert out == _EVENT + _DONE
    assert stripped == 1


def test_a_crlf_split_between_cr_and_lf_keeps_the_event_whole() -> None:
    # The LF after a removed line's CR belongs to that line: left alone it would be a
    # blank line, ending the event early.
    stream = b"data: a\n: owngate-x\r\ndata: b\n\n"
    for cut in range(len(stream) + 1):
        assert _relay(stream, [cut])[0] == b"data: a\ndata: b\n\n", cut


def test_an_upper_case_receipt_split_at_any_byte_is_held_at_most_the_bound() -> None:
    """Another request's receipt written `: OWNGATE-receipt` is removed like the lower-case
    one, and what is held between reads stays within the bound (64 bytes)."""
    line = b": OWNGATE-receipt " + b"A" * 200 + b"\n"
    for cut in range(len(line) + 1):
        comments = CommentFilter()
        out = comments.feed(_EVENT) + comments.feed(line[:cut])
        assert len(comments._held) <= 64, cut  # the bound under test
        out += comments.feed(line[cut:] + _DONE) + comments.flush()
        assert (out, comments.stripped) == (_EVENT + _DONE, 1), cut


def test_a_comment_whose_blanks_run_past_the_bound_is_removed() -> None:
    hidden = b":" + b" " * 100 + b"owngate-receipt X\n"
    assert _relay(_EVENT + hidden + _DONE, [len(_EVENT) + 50]) == (_EVENT + _DONE, 1)
    short = b":" + b" " * 30 + b"ok\n"  # a short padded comment is an ordinary one
    assert _relay(short, [10])[0] == short


def test_a_megabyte_comment_without_end_is_dropped_as_it_comes_not_buffered() -> None:
    pieces = [b": owngate-receipt "] + [b"A" * 4096] * 256  # 1 MiB, no line end
    comments = CommentFilter()
    assert comments.feed(_EVENT) == _EVENT
    tracemalloc.start()
    try:
        out = [comments.feed(piece) for piece in pieces]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out == [b""] * len(out)
    assert peak < 64 * 1024  # nothing held: the pieces are dropped as they arrive
    assert comments.feed(b"\n" + _DONE) == _DONE  # its line end: the stream goes on
    assert comments.stripped == 1


def test_the_usual_read_is_returned_as_is() -> None:
    comments = CommentFilter()
    assert comments.feed(_EVENT) is _EVENT
    assert comments.feed(b": ping\n\n") == b": ping\n\n"


def _reference(stream: bytes) -> bytes:
    """Line by line, as the module docstring defines it."""
    lines = re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", stream)
    kept: list[bytes] = []
    for line in lines:
        # The client's parser skips a BOM that opens the stream it gets, and any line may
        # be its first (what is held back after the filter): a BOM before any line.
        body = line[3:] if line.startswith(b"\xef\xbb\xbf") else line
        text = body[1:].lstrip(b" \t") if body.startswith(b":") else None
        if text is not None and text.lower().startswith(b"owngate-"):
            continue
        unended = not line.endswith((b"\n", b"\r"))
        if text and unended and b"owngate-".startswith(text.lower()):  # ended inside a marker
            continue
        kept.append(line)
    return b"".join(kept)


_PIECES = [
    b"data: x\n",
    b"\n",
    b"\r\n",
    b"\r",
    b": ping\n",
    b": owngate-receipt X\n",
    b":owngate-attest Y\r\n",
    b":\t owngate-z\r",
    b": own\n",
    b"data: owngate-\n",
    b"\xef\xbb\xbf",
    b":",
    b" ",
    b"owngate-",
    b"o",
    b": OWNGATE-receipt X\n",
    b"OwnGate-",
    b"O",
]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), max_size=10)
    .map(b"".join)
    .flatmap(
        lambda stream: st.tuples(st.just(stream), st.lists(st.integers(0, len(stream)), max_size=5))
    )
)
def test_any_stream_split_anywhere_matches_the_line_by_line_reading(
    case: tuple[bytes, list[int]],
) -> None:
    stream, cuts = case
    assert _relay(stream, cuts)[0] == _reference(stream)


def test_a_hosted_stream_cannot_carry_a_comment_line() -> None:
    """Hosted streams are encoded by the gateway: a provider's text, line ends and all,
    stays inside one JSON `data:` line."""
    text = "a\n: owngate-receipt X\r\n:owngate-attest Y\rb"
    choices = [{"index": 0, "delta": {"content": text}}]
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": choices}
    encoded, _ = encode_chunk("chat", chunk, with_usage=False)
    assert encoded is not None
    assert encoded.startswith(b"data: ") and encoded.endswith(b"\n\n")
    assert b"\r" not in encoded and encoded.count(b"\n") == 2


def test_removed_lines_are_reported_at_most_once_a_minute_per_backend() -> None:
    reports = Tally(every_s=60.0)
    assert reports.note("gpu", 1000.0, 2) == 2
    assert reports.note("gpu", 1030.0, 3) == 0  # quiet: added to the next report
    assert reports.note("cpu", 1030.0, 1) == 1  # each backend apart
    assert reports.note("gpu", 1059.9, 1) == 0
    assert reports.note("gpu", 1060.0, 5) == 5 + 3 + 1
    assert reports.note("gpu", 1061.0, 1) == 0


@pytest.mark.parametrize(
    "answer",
    [
        b'{"a": 1}',
        b'{"a": 1}\n',
        b'{"a": 1}\n: owngate-receipt x\n',
        b'{"a": 1}\n: OWNGATE-x',
        b'{"a": 1}\n: owng',  # a held start the end drops
        b'{"a": 1}\n:' + b" " * 70 + b"x",  # blanks past the bound
        b'{"a": 1}\r\xef\xbb\xbf: owngate-x\r\n',
        b'{"a": 1}\n\xef\xbb',
        b": ping\n",
        b"",
        b'{\n  "a": 1\n}\n',  # pretty-printed: walked only when a `:` opens a line
        b'{"a":\n:' + b" " * 70 + b"x\n1}",
        b'{"a": 1}\r\n\r\n',
        b':{"a": 1}\n',
    ],
)
def test_a_whole_answer_loses_what_the_filter_removes_and_nothing_else(answer: bytes) -> None:
    """`without_comments` (a whole answer's, the gateway's and the sidecar's) skips the
    walk for an answer with nothing to remove: it must agree with the filter on every
    answer, or the sidecar countersigns bytes other than the gateway relays."""
    comments = CommentFilter()
    assert without_comments(answer) == (comments.feed(answer) + comments.flush(), comments.stripped)


_PIECES = [b":", b" ", b"\t", b"\n", b"\r", b"owngate-", b"OWNG", b"x", b"\xef\xbb\xbf", b"\xef"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*_PIECES, b" " * 70]), max_size=12))
def test_without_comments_agrees_with_the_filter(pieces: list[bytes]) -> None:
    answer = b"".join(pieces)
    comments = CommentFilter()
    assert without_comments(answer) == (comments.feed(answer) + comments.flush(), comments.stripped)


def _in_reads(data: bytes, cuts: list[int]) -> bytes:
    comments = CommentFilter()
    out, prev = b"", 0
    for cut in [*cuts, len(data)]:
        out += comments.feed(data[prev:cut])
        prev = cut
    return out + comments.flush()


def test_a_comment_with_blanks_past_the_bound_goes_whether_or_not_a_read_ends_inside() -> None:
    """The sidecar and the gateway read one stream in different pieces: a line that the
    sidecar took in one read and relayed, and the gateway's read ended inside past the
    held bound, was removed by the gateway alone (before: whole, it passed), so the
    gateway relayed bytes other than the sidecar countersigned (`mismatch`), at the
    inference server's choosing (a long run of blanks is split by some read)."""
    line = b":" + b" " * 70 + b"x\n"
    data = b"data: 1\n\n" + line + b"data: 2\n\n"
    whole = _in_reads(data, [])
    assert whole == _in_reads(data, [9 + 66]) == b"data: 1\n\ndata: 2\n\n"
    assert _in_reads(data, [9]) == whole  # the line whole in a read after a clean one
    assert without_comments(data) == (whole, 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*_PIECES, b" " * 70]), max_size=12), st.data())
def test_the_filter_removes_the_same_lines_however_the_reads_split(
    pieces: list[bytes], data: st.DataObject
) -> None:
    answer = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(answer)), max_size=4)))
    assert _in_reads(answer, cuts) == _in_reads(answer, [])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*_PIECES, b" " * 70, b"\t" * 30]), max_size=12))
def test_what_the_filter_lets_through_it_lets_through_again(pieces: list[bytes]) -> None:
    """The gateway filters again what the sidecar filtered and countersigned: a line the
    first pass left (or made by joining) that the second removed would be a mismatch."""
    once, _ = without_comments(b"".join(pieces))
    assert without_comments(once) == (once, 0)


def test_a_whole_answer_s_comment_lines_are_walked_with_turns_between() -> None:
    """Each removed line costs the walk Python: a backend's 16 MiB whole answer of
    `: owngate-x` lines held the event loop 3.4 s (CPU) in one `without_comments`. The
    gateway and the sidecar walk it 16 KiB at a time, the loop turning between (counted)."""
    answer = b": owngate-x\n" * (256 * 1024 // 12)
    (kept, removed), turns = asyncio.run(with_turns_beside(without_comments_in_turns(answer)))
    assert (kept, removed) == (b"", len(answer) // 12)
    assert turns >= len(answer) // (16 * 1024) - 1, turns
    nothing = b'{"a": 1}\n' * 10_000  # nothing to remove: not walked, no turn
    (kept, removed), turns = asyncio.run(with_turns_beside(without_comments_in_turns(nothing)))
    assert (kept, removed, turns) == (nothing, 0, 1)  # (the turn the task beside starts on)


# Lines that straddle the walk's 16 KiB steps: a CRLF, a comment's blanks, the marker.
_STRADDLING = [
    b"d" * (16 * 1024 - 1) + b"\r\n: owngate-x\r\ndata: 1\n\n",
    b"data: 1\n" + b":" + b" " * (16 * 1024) + b"owngate-x\n" + b"data: 2\n\n",
    b"x" * (16 * 1024 - 5) + b"\n: ow" + b"ngate-a\n:  ping\n" * 3000 + b"\xef\xbb\xbf: owngate-",
]


@pytest.mark.parametrize("answer", _STRADDLING, ids=["crlf", "blanks", "marker"])
def test_the_walk_in_turns_removes_what_the_walk_in_one_go_does(answer: bytes) -> None:
    assert asyncio.run(without_comments_in_turns(answer)) == without_comments(answer)
