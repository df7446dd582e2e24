"""A chunk with the last parsed chunk's shape is not parsed (`EventReader._learn`), and
the record stays the SDK's: what varies between the shapes must be a plain string (no
quote, backslash or control character), else the value is parsed as any other. And a
usage count past 64 bits is the integer the SDK shows (orjson reads a float), so the
record states no usage, never an earlier one (gateway/api/usage_read.py `counts_in`)."""

from __future__ import annotations

import pytest

from gateway.api.sse import StreamWatch
from gateway.api.sse_framing import one_data_line
from tests.helpers.sdk_stream import counts, sdk_shown_usage

HEAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":'


def _token(content: bytes) -> bytes:
    return HEAD + b'[{"index":0,"delta":{"content":"' + content + b'"}}]}\n\n'


def _usage(prompt: int) -> bytes:
    usage = b'{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":2}' % prompt
    return HEAD + b'[],"usage":' + usage + b"}\n\n"


# Contents that make the chunk another document (or none): never taken for the shape.
INJECTED = {
    "usage": b'hi"}}],"usage":{"prompt_tokens":99},"x":[{"a":{"b":"',
    "usage, escaped quote": b'hi\\"}}],"usage":{"prompt_tokens":99},"x":[{"a":{"b":"',
    "tab": b"a\tb",
    "control": b"a\x01b",
    "escape": b"a\\nb",
    "bad escape": b"a\\qb",
    "quote": b'a"b',
    "overlap": b'"}}]}\n\ndata: {"a":"',
    "non-ASCII": "é😀".encode(),
    "DEL": b"a\x7fb",
    "empty": b"",
}
ERRORS = {
    "error": b'hi"}}],"error":{"message":"x"},"x":[{"a":{"b":"',
}


def _reads(body: bytes, how: str) -> list[bytes]:
    if how == "whole":
        return [body]
    events = [event + b"\n\n" for event in body.split(b"\n\n") if event]
    return events  # one event a read: a paced server's


def _relay(reads: list[bytes], *, strip: bool) -> tuple[StreamWatch, bytes]:
    watch = StreamWatch(strip_usage=strip)
    out = [watch.feed(read, one_data_line(read)) for read in reads]
    out.append(watch.flush())
    watch.end()
    return watch, b"".join(out)


def _recorded(body: bytes, out: bytes) -> dict[str, int] | None:
    """The usage to record: the last the client's SDK was shown in what went out, else
    (strip mode) that of the usage-only chunks held back, up to where its SDK stops."""
    shown = counts(sdk_shown_usage(out))
    return shown if shown is not None else counts(sdk_shown_usage(body))


@pytest.mark.parametrize("how", ["whole", "paced"])
@pytest.mark.parametrize("strip", [False, True])
@pytest.mark.parametrize("content", INJECTED.values(), ids=INJECTED.keys())
def test_a_chunk_of_the_last_one_s_shape_but_for_its_string_is_read_as_the_sdk_reads_it(
    content: bytes, strip: bool, how: str
) -> None:
    body = _usage(1) + _token(b"hi") + _token(b"yo") + _token(content) + _usage(2)
    body += _token(b"hi") + b"data: [DONE]\n\n"
    watch, out = _relay(_reads(body, how), strip=strip)
    assert watch.usage == _recorded(body, out)
    assert not watch.error_event


@pytest.mark.parametrize("how", ["whole", "paced"])
@pytest.mark.parametrize("content", ERRORS.values(), ids=ERRORS.keys())
def test_an_error_spelled_into_the_shape_s_string_is_an_error_event(
    content: bytes, how: str
) -> None:
    body = _usage(1) + _token(b"hi") + _token(content) + _usage(2) + b"data: [DONE]\n\n"
    watch, _ = _relay(_reads(body, how), strip=False)
    assert watch.error_event
    assert (
        watch.usage
        == counts(sdk_shown_usage(body))
        == {
            "prompt_tokens": 1,
            "completion_tokens": 1,
            "total_tokens": 2,
        }
    )


@pytest.mark.parametrize("how", ["whole", "paced"])
@pytest.mark.parametrize("strip", [False, True])
@pytest.mark.parametrize("prompt", [2**64, 2**70, -(2**63) - 1])
def test_a_usage_count_past_64_bits_is_the_sdk_s_integer(
    prompt: int, strip: bool, how: str
) -> None:
    # orjson reads `18446744073709551616` as 1.8446744073709552e19 (no count: the earlier
    # usage stayed); the SDK's `json.loads` as the integer, which its client is shown.
    body = _usage(5) + _token(b"hi") + _usage(prompt) + b"data: [DONE]\n\n"
    watch, _ = _relay(_reads(body, how), strip=strip)
    shown = counts(sdk_shown_usage(body))
    assert shown is not None and shown["prompt_tokens"] == prompt
    assert watch.usage == shown
