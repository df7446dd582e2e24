"""Token usage a backend reports is taken only as it must be written: whole numbers
0..2**53 under their own names. Anything else (a string, a float, a bool, a negative or
huge number) is no usage: the completion record carries none, and the tenant's budget is
charged the byte estimate, never a count the backend did not write as one."""

from __future__ import annotations

import json

import orjson
import pytest

from gateway.api.answer_reads import check_readable
from gateway.api.sse import StreamWatch
from gateway.api.trail import Trail
from gateway.provenance import Salts, Usage
from gateway.upstream.failures import UpstreamError

GOOD = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
BAD = [
    {"prompt_tokens": "3", "completion_tokens": 1, "total_tokens": 4},  # a string
    {"prompt_tokens": 3.9, "completion_tokens": 1, "total_tokens": 4},  # a float
    {"prompt_tokens": True, "completion_tokens": 1, "total_tokens": 4},  # a bool
    {"prompt_tokens": -3, "completion_tokens": 1, "total_tokens": 4},
    {"prompt_tokens": 2**60, "completion_tokens": 1, "total_tokens": 4},
    {"prompt_tokens": [3], "completion_tokens": 1, "total_tokens": 4},
]


def answered(usage: object) -> Trail:
    trail = Trail(Salts.generate(), "")
    trail.answered(orjson.dumps({"choices": [], "usage": usage}))
    return trail


def test_a_whole_answer_s_usage_is_read() -> None:
    assert answered(GOOD).usage() == Usage(3, 1, 4)


@pytest.mark.parametrize("usage", BAD, ids=["str", "float", "bool", "negative", "huge", "list"])
def test_counts_not_written_as_counts_are_no_usage(usage: dict[str, object]) -> None:
    trail = answered(usage)
    assert trail.usage() is None
    assert trail.charged_tokens() == -(-trail.sent_bytes // 4)  # the estimate


@pytest.mark.parametrize("usage", BAD, ids=["str", "float", "bool", "negative", "huge", "list"])
def test_a_held_back_usage_chunk_s_counts_are_checked_too(usage: dict[str, object]) -> None:
    watch = StreamWatch(strip_usage=True)
    chunk = b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n"
    watch.feed(chunk)
    trail = Trail(Salts.generate(), "")
    if watch.usage is not None:
        trail.reported(watch.usage)
    assert trail.usage() is None


@pytest.mark.parametrize(
    "line",
    [
        b'data: {"choices":[],"usage":%s}\r\n\r\n',  # CRLF
        b'data: {"choices":[],"usage":%s}\r\r',  # CR
        b'data:{"choices":[],"usage":%s}\n\n',  # no space after the colon
    ],
    ids=["crlf", "cr", "no-space"],
)
def test_a_relayed_usage_chunk_is_read_in_any_sse_line_form(line: bytes) -> None:
    """The usage of a stream's tail (a stream whose counts no watch noted: its client
    left) is read whatever line ends the backend used, `data:` with or without space."""
    trail = Trail(Salts.generate(), "")
    trail.relayed(b'data: {"choices":[]}\n\n' + line % orjson.dumps(GOOD) + b"data: [DONE]\n\n")
    assert trail.usage() == Usage(3, 1, 4)


def test_a_whole_answer_s_usage_is_read_after_leading_whitespace() -> None:
    """JSON may start with whitespace (RFC 8259): the client's parser reads the usage."""
    trail = Trail(Salts.generate(), "")
    trail.answered(b"\r\n \t" + orjson.dumps({"choices": [], "usage": GOOD}))
    assert trail.usage() == Usage(3, 1, 4)


def test_a_stream_tail_s_usage_is_read_up_to_its_done() -> None:
    """The tail of a stream whose client left: usage after `[DONE]` is none it read."""
    trail = Trail(Salts.generate(), "")
    after = b'data: {"choices":[],"usage":{"prompt_tokens":9,"total_tokens":9}}\n\n'
    trail.relayed(b'data: {"choices":[],"usage":%s}\n\ndata: [DONE]\n\n' % orjson.dumps(GOOD))
    trail.relayed(after)
    assert trail.usage() == Usage(3, 1, 4)


@pytest.mark.parametrize(
    ("before", "extra"),
    [
        (b"\xef\xbb\xbf", b""),  # a byte order mark
        (b"", b',"x":NaN'),  # NaN, which Python's json reads
        (b"", b',"x":"\\ud800"'),  # a lone surrogate escape
        (b"", b',"x":1e400'),  # past a double's range
    ],
    ids=["bom", "nan", "surrogate", "1e400"],
)
def test_a_whole_answer_orjson_refuses_is_read_as_the_client_reads_it(
    before: bytes, extra: bytes
) -> None:
    trail = Trail(Salts.generate(), "")
    trail.answered(before + orjson.dumps({"choices": [], "usage": GOOD})[:-1] + extra + b"}")
    assert trail.usage() == Usage(3, 1, 4)


def test_a_whole_answer_that_is_no_json_states_no_usage() -> None:
    """A whole (non-stream) answer is one document to its client (`json.loads` of its
    bytes, httpx's `Response.json`): one written as SSE `data:` lines shows no usage, and
    the record read it line by line and stated one (found by review)."""
    body = b'data: {"usage":{"prompt_tokens":900,"completion_tokens":900,"total_tokens":1800}}\n\n'
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)  # what the client's SDK reads: no usage
    for whole in (body, b"\n" + body, body + b"data: [DONE]\n\n"):
        trail = Trail(Salts.generate(), "")
        trail.answered(whole)
        assert trail.usage() is None, whole
        assert trail.charged_tokens() == -(-trail.sent_bytes // 4)  # the estimate


@pytest.mark.parametrize(
    "whole",
    [
        orjson.dumps({"choices": [], "usage": GOOD}),
        b'{"usage":' + orjson.dumps(GOOD) + b',"x":NaN}',  # orjson refuses, json.loads reads
        orjson.dumps({"choices": [], "usage": BAD[0]}),
        orjson.dumps({"choices": []}),
        b"\xef\xbb\xbf" + orjson.dumps({"usage": GOOD}),
        json.dumps({"usage": GOOD}).encode("utf-16"),
    ],
)
def test_the_usage_read_before_an_answer_goes_out_is_the_one_read_after(whole: bytes) -> None:
    """`check_readable` (the answer's one parse, before the client sees it) states what
    the trail's own read of the answer states."""
    trail = Trail(Salts.generate(), "")
    trail.answered(whole)
    assert check_readable(whole) == trail.usage()
    assert check_readable(whole, counted=False) is None


@pytest.mark.parametrize(
    "whole",
    [
        orjson.dumps({"usage": GOOD})[:-1],  # cut short
        orjson.dumps({"usage": GOOD}) + b"<!-- -->",
        orjson.dumps({"usage": GOOD}) * 2,
        b'{"usage":{"prompt_tokens":3},"x":"\xff"}',
        b"{<html>",
    ],
)
def test_an_answer_json_loads_refuses_is_of_the_wrong_shape(whole: bytes) -> None:
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):
        json.loads(whole)  # what the client's SDK does with it
    for counted in (True, False):
        with pytest.raises(UpstreamError) as info:
            check_readable(whole, counted=counted)
        assert info.value.kind == "shape"


@pytest.mark.parametrize(
    ("whole", "kind"),
    [
        (orjson.dumps({"usage": GOOD})[:-1], "closed"),  # cut short by a backend that died
        (b"<html>", "closed"),
        (b"", "closed"),
        (orjson.dumps([GOOD]), "shape"),  # whole, and no object
        (b'{"usage":' + orjson.dumps(GOOD) + b',"x":NaN}', None),  # json.loads reads it
        (json.dumps({"usage": GOOD}).encode("utf-16"), None),
    ],
)
def test_an_answer_the_close_ended_is_whole_as_the_client_reads_it(
    whole: bytes, kind: str | None
) -> None:
    """`closed`: a JSON answer no framing ended, told whole by the same one parse."""
    if kind is None:
        assert check_readable(whole, closed=True) == Usage(3, 1, 4)
        return
    with pytest.raises(UpstreamError) as info:
        check_readable(whole, closed=True)
    assert info.value.kind == kind
