"""An event nested past the read bounds (`usage_read.MAX_DEPTH`) whose data is not JSON at
all (`[` 600 times, then `x`): the client's `json.loads` refuses it at its text, before
any recursion limit, so the SDK raises there and shows nothing after. The reader took
every such event for one the client may read, went on, and recorded a later usage the
client never saw (gateway/api/sse_data.py, `not_json`)."""

from __future__ import annotations

import json

import pytest

from gateway.api.sse import StreamWatch
from tests.helpers.sdk_stream import counts, sdk_shown_usage


def _usage(n: int) -> bytes:
    return (
        b'data: {"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":1,'
        b'"total_tokens":%d}}\n\n' % (n, n + 1)
    )


NOT_JSON = {
    "deep-then-x": b"data: " + b"[" * 600 + b"x\n\n",
    "deep-unclosed": b"data: " + b"[" * 600 + b"]" * 599 + b"\n\n",
    "deep-with-usage-word": b'data: {"usage":' + b"[" * 600 + b"}\n\n",
    "thread-event": b"event: thread.run\ndata: " + b"{" * 600 + b"\n\n",
}
RECEIPT = b": owngate-receipt x\n\n"


@pytest.mark.parametrize("case", list(NOT_JSON))
def test_a_deep_event_that_is_not_json_stops_the_record_where_the_sdk_raises(
    case: str,
) -> None:
    bad = NOT_JSON[case]
    with pytest.raises(json.JSONDecodeError):  # the client's parser, at its text
        json.loads(bad.split(b"data: ", 1)[1][:-2])
    body = _usage(1) + bad + _usage(2) + b"data: [DONE]\n\n"
    shown = counts(sdk_shown_usage(body + RECEIPT))
    assert shown is not None and shown["prompt_tokens"] == 1
    start = len(_usage(1))
    cuts = [None, start, start + 300, start + len(bad) - 1, start + len(bad)]
    for cut in cuts:
        reads = [body] if cut is None else [body[:cut], body[cut:]]
        watch = StreamWatch(strip_usage=False)
        for read in reads:
            watch.feed(read)
        watch.flush()
        watch.end()
        assert (watch.usage, watch.events.stopped) == (shown, True), cut


def test_a_deep_event_the_client_reads_still_leaves_the_stream_read_on() -> None:
    """(The other side: nested 600 deep and JSON, the client reads it and goes on.)"""
    deep = b"data: " + b"[" * 600 + b"]" * 600 + b"\n\n"
    body = _usage(1) + deep + _usage(2) + b"data: [DONE]\n\n"
    watch = StreamWatch(strip_usage=False)
    watch.feed(body)
    watch.flush()
    watch.end()
    assert watch.usage == counts(sdk_shown_usage(body + RECEIPT))
    assert watch.usage is not None and watch.usage["prompt_tokens"] == 2
