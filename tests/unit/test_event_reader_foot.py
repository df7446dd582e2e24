"""A chunk taken for the last parsed chunk's shape (`EventReader._learn`) must end with
that chunk's foot too, not only be as long: a chunk with its head, a plain string and
another foot of the same length shows the client a usage (or is no JSON, where the SDK
raises), and the record must say so (found by review: no test failed with the foot's
test removed from either fast path)."""

from __future__ import annotations

import pytest

from gateway.api.sse import StreamWatch
from gateway.api.sse_framing import one_data_line
from tests.helpers.sdk_stream import counts, sdk_shown_usage

HEAD = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"'
FOOT = b'"}}],"usage":null,"pad":"aaaaaaaaaaaaaaaaaaaaaaaaaaa"}\n\n'
SHOWS = b'"}}],"usage":{"prompt_tokens":9},"pad":"aaaaaaaaaaaa"}\n\n'  # a usage, same length
NOT_JSON = b'"}}],"usage":null,"pad":"aaaaaaaaaaaaaaaaaaaaaaaaaaa"]\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"total_tokens":5}}\n\n'
LATER = USAGE.replace(b"5", b"7")  # after `data` that is no JSON: never shown
OTHER = {"shows-a-usage": HEAD + b"x" + SHOWS, "not-json": USAGE + HEAD + b"x" + NOT_JSON + LATER}


@pytest.mark.parametrize("how", ["whole", "events"])
@pytest.mark.parametrize("other", list(OTHER))
def test_a_chunk_with_the_learned_head_and_another_foot_is_parsed(other: str, how: str) -> None:
    assert len(SHOWS) == len(FOOT) == len(NOT_JSON)
    body = HEAD + b"hi" + FOOT + OTHER[other]
    reads = [body] if how == "whole" else [e + b"\n\n" for e in body.split(b"\n\n") if e]
    watch = StreamWatch(strip_usage=False)
    for read in reads:
        watch.feed(read, one_data_line(read))
    watch.end()
    shown = counts(sdk_shown_usage(body))
    assert shown == (
        {"prompt_tokens": 9, "completion_tokens": 0, "total_tokens": 0}
        if other == "shows-a-usage"
        else {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    )
    assert watch.usage == shown
