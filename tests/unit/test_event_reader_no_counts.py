"""A usage object whose counts are not JSON integers (`3.9`, `"3"`, `true`) is still the
usage the client's SDK shows last (`chunk.usage`, built without validation): the record
then states none (docs/provenance.md, `usage`), never an earlier chunk's, on the event
reader's every path (a paced one-line read, a read of whole events, a read cut anywhere)
and on a stream tail's (`trail._usage`). And the tail's usage is read with `counts_in`:
an integer past 64 bits is that integer, no count, not an earlier chunk's."""

from __future__ import annotations

import orjson
import pytest

from gateway.api.sse import StreamWatch
from gateway.api.sse_framing import one_data_line
from gateway.api.trail import Trail
from gateway.provenance import Salts, Usage
from tests.helpers.sdk_stream import counts, sdk_shown_usage

GOOD = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
NO_COUNTS = {
    "float": b'{"prompt_tokens":3.9,"completion_tokens":1,"total_tokens":4}',
    "string": b'{"prompt_tokens":"3","completion_tokens":1,"total_tokens":4}',
    "bool": b'{"prompt_tokens":true,"completion_tokens":1,"total_tokens":4}',
}


def _chunk(usage: bytes, choices: bytes = b"[]") -> bytes:
    return b'data: {"id":"c","choices":' + choices + b',"usage":' + usage + b"}\n\n"


def _reads(body: bytes, how: str) -> list[bytes]:
    if how == "whole":
        return [body]
    if how == "events":  # one event a read, each a paced server's `one_data_line`
        return [event + b"\n\n" for event in body.split(b"\n\n") if event]
    if how == "crlf":  # read line by line (`EventReader._dispatch`)
        return [body.replace(b"\n", b"\r\n")]
    return [body[at : at + 5] for at in range(0, len(body), 5)]


@pytest.mark.parametrize("how", ["whole", "events", "cut", "crlf"])
@pytest.mark.parametrize("usage", list(NO_COUNTS))
def test_a_last_usage_without_counts_is_no_usage_not_the_earlier_one(usage: str, how: str) -> None:
    body = TOKEN + _chunk(orjson.dumps(GOOD)) + TOKEN + _chunk(NO_COUNTS[usage]) + TOKEN
    watch = StreamWatch(strip_usage=False)
    reads = _reads(body, how)
    out = b"".join(watch.feed(read, one_data_line(read)) for read in reads)
    out += watch.flush()
    watch.end()
    assert out == b"".join(reads)
    assert sdk_shown_usage(out) == orjson.loads(NO_COUNTS[usage])  # what the client saw
    assert counts(sdk_shown_usage(out)) is None
    assert watch.usage is None


def test_a_later_usage_with_counts_is_read_again() -> None:
    body = _chunk(orjson.dumps(GOOD)) + _chunk(NO_COUNTS["float"]) + _chunk(b'{"total_tokens":7}')
    watch = StreamWatch(strip_usage=False)
    watch.feed(body)
    assert (
        watch.usage
        == counts(sdk_shown_usage(body))
        == {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "total_tokens": 7,
        }
    )


@pytest.mark.parametrize("usage", list(NO_COUNTS))
def test_a_stream_tail_s_last_usage_without_counts_is_no_usage(usage: str) -> None:
    trail = Trail(Salts.generate(), "")
    tail = _chunk(orjson.dumps(GOOD)) + _chunk(NO_COUNTS[usage]) + b"data: [DONE]\n\n"
    trail.relayed(tail)
    assert counts(sdk_shown_usage(tail)) is None
    assert trail.usage() is None


def test_a_stream_tail_s_count_past_64_bits_is_no_usage_not_the_earlier_one() -> None:
    """`counts_in`, not `counts_of`, on the tail's path: orjson reads the count as a float
    (no count, so the earlier chunk's usage was taken), the client's SDK as the integer."""
    huge = b'{"prompt_tokens":18446744073709551616,"completion_tokens":1,"total_tokens":4}'
    tail = _chunk(orjson.dumps(GOOD)) + _chunk(huge) + b"data: [DONE]\n\n"
    assert sdk_shown_usage(tail) == {
        "prompt_tokens": 2**64,
        "completion_tokens": 1,
        "total_tokens": 4,
    }
    trail = Trail(Salts.generate(), "")
    trail.relayed(tail)
    assert trail.usage() is None
    trail = Trail(Salts.generate(), "")
    trail.relayed(_chunk(orjson.dumps(GOOD)) + b"data: [DONE]\n\n")
    assert trail.usage() == Usage(3, 1, 4)  # (the tail's path reads a usage at all)


# A usage present but no object: the SDK's `chunk.usage` is that value (built without
# validation), no counts: the record states none, never an earlier chunk's.
NOT_OBJECTS = {"int": b"7", "string": b'"7"', "list": b"[1]", "false": b"false", "zero": b"0"}


@pytest.mark.parametrize("how", ["whole", "events", "cut", "crlf"])
@pytest.mark.parametrize("usage", list(NOT_OBJECTS))
def test_a_last_usage_that_is_no_object_is_no_usage_not_the_earlier_one(
    usage: str, how: str
) -> None:
    body = TOKEN + _chunk(orjson.dumps(GOOD)) + TOKEN + _chunk(NOT_OBJECTS[usage]) + TOKEN
    watch = StreamWatch(strip_usage=False)
    reads = _reads(body, how)
    out = b"".join(watch.feed(read, one_data_line(read)) for read in reads)
    out += watch.flush()
    watch.end()
    assert out == b"".join(reads)
    assert sdk_shown_usage(out) == orjson.loads(NOT_OBJECTS[usage])  # what the client saw
    assert counts(sdk_shown_usage(out)) is None
    assert watch.usage is None


@pytest.mark.parametrize("usage", list(NOT_OBJECTS))
def test_a_stream_tail_s_last_usage_that_is_no_object_is_no_usage(usage: str) -> None:
    trail = Trail(Salts.generate(), "")
    tail = _chunk(orjson.dumps(GOOD)) + _chunk(NOT_OBJECTS[usage]) + b"data: [DONE]\n\n"
    trail.relayed(tail)
    assert counts(sdk_shown_usage(tail)) is None
    assert trail.usage() is None


def test_a_null_usage_after_a_usage_object_leaves_it_shown() -> None:
    """`"usage": null` (every chunk of some servers) shows none: the earlier usage is the
    last the SDK showed, on the reader's path and the tail's."""
    body = _chunk(orjson.dumps(GOOD)) + _chunk(b"null", b'[{"index":0,"delta":{}}]')
    watch = StreamWatch(strip_usage=False)
    watch.feed(body)
    assert watch.usage == counts(sdk_shown_usage(body)) == GOOD
    trail = Trail(Salts.generate(), "")
    trail.relayed(body + b"data: [DONE]\n\n")
    assert trail.usage() == Usage(3, 1, 4)
