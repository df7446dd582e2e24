"""An event the reader lets go unread (over `max_event`) makes the usage unknown, as it
may show one; but where a line in it is not UTF-8, the client's SDK raises at that line,
before the event's blank line: it never dispatched the event, so the usage it showed is
the one before (found by review: the record stated none where the client saw one)."""

from __future__ import annotations

import pytest

from gateway.api.sse_events import EventReader
from tests.helpers.sdk_stream import counts, sdk_shown_usage

SMALL = (
    b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
)
BIG = (
    b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}\n\n'
)
LONG = b'data: {"choices":[{"delta":{"content":"' + b"x" * 70_000
BAD = {
    "surrogate": b"\xed\xa0\x80",
    "overlong": b"\xc0\x80",
    "ff": b"\xff",
}


def _reads(body: bytes, how: str) -> list[bytes]:
    if how == "whole":
        return [body]
    return [body[at : at + 4096] for at in range(0, len(body), 4096)]  # let go first


@pytest.mark.parametrize("how", ["whole", "reads"])
@pytest.mark.parametrize("bad", list(BAD))
def test_a_line_not_utf8_inside_a_let_go_event_leaves_the_usage_shown_before(
    bad: str, how: str
) -> None:
    body = SMALL + LONG + BAD[bad] + b'"}}]}\n\n' + BIG
    reader = EventReader()
    for read in _reads(body, how):
        reader.feed(read)
    reader.finish()
    assert counts(sdk_shown_usage(body)) == {
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "total_tokens": 2,
    }
    assert reader.stopped
    assert reader.usage == counts(sdk_shown_usage(body))
    assert not reader.unknown


def test_a_character_cut_short_by_the_end_inside_a_let_go_event_too() -> None:
    body = SMALL + LONG + "日".encode()[:2]
    reader = EventReader()
    reader.feed(body)
    reader.finish()
    assert reader.usage == counts(sdk_shown_usage(body)) is not None


def test_a_let_go_event_that_is_all_utf8_still_makes_the_usage_unknown() -> None:
    body = SMALL + LONG + b'"}}]}\n\n'
    reader = EventReader()
    for read in _reads(body, "reads"):
        reader.feed(read)
    reader.finish()
    assert reader.usage is None and reader.unknown
