"""A read cut between the CR and the LF of a CRLF blank line: the OpenAI SDK's line
decoder (openai/_streaming.py, `_SSELineDecoder._skip_lf`) takes the LF that starts the
next read as the CRLF's end, no line of its own. The stream watch's event reader must too:
once an event set an `id`, an empty line dispatches an event without data, at which the
SDK raises (`json.loads("")`), so an LF read as a blank line stopped the record at a
usage the client had gone past (gateway/api/sse_events.py)."""

from __future__ import annotations

import pytest
from openai._streaming import SSEDecoder

from gateway.api.sse import StreamWatch
from gateway.api.sse_events import EventReader
from gateway.api.sse_framing import one_data_line
from tests.helpers.sdk_stream import counts, sdk_shown_usage


def _usage(n: int) -> bytes:
    return (
        b'data: {"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":1,'
        b'"total_tokens":%d}}' % (n, n + 1)
    )


# `id` set, then events ended by CRLF blank lines; the gateway's receipt line last.
BODY = b"".join(
    [
        b"id: 7\r\n" + _usage(1) + b"\r\n\r\n",
        _usage(2) + b"\r\n\r\n",
        _usage(3) + b"\r\n\r\n",
        b"data: [DONE]\r\n\r\n",
    ]
)
RECEIPT = b": owngate-receipt x\n\n"
# Each place where a CR of a blank line ends a read and its LF starts the next.
CR_CUTS = [i + 1 for i in range(len(BODY) - 1) if BODY[i : i + 2] == b"\r\n"]


def _sdk_events(reads: list[bytes]) -> list[tuple[str | None, str]]:
    return [(e.event, e.data) for e in SSEDecoder().iter_bytes(iter(reads))]


def _watched(reads: list[bytes]) -> dict[str, int] | None:
    watch = StreamWatch(strip_usage=False)
    for read in reads:
        watch.feed(read, one_data_line(read))
    watch.flush()
    watch.end()
    return watch.usage


def test_the_sdk_reads_the_stream_alike_whatever_the_cut() -> None:
    """(The premise: the SDK's decoder does not depend on where reads are cut.)"""
    whole = _sdk_events([BODY + RECEIPT])
    assert (None, "[DONE]") in whole
    assert counts(sdk_shown_usage(BODY + RECEIPT))["prompt_tokens"] == 3  # type: ignore[index]
    for cut in CR_CUTS:
        assert _sdk_events([BODY[:cut], BODY[cut:] + RECEIPT]) == whole


@pytest.mark.parametrize("cut", CR_CUTS)
def test_an_lf_after_a_read_ending_a_crlf_s_cr_is_no_blank_line(cut: int) -> None:
    shown = counts(sdk_shown_usage(BODY + RECEIPT))
    reader = EventReader()
    reader.feed(BODY[:cut])
    reader.feed(BODY[cut:])
    reader.feed(RECEIPT)
    reader.finish()
    assert (reader.usage, reader.stopped) == (shown, True)
    assert _watched([BODY[:cut], BODY[cut:], RECEIPT]) == shown


def test_a_read_of_the_lf_alone_is_skipped_too() -> None:
    """The LF may come as a read of its own: skipped, the next read is read as usual."""
    cut = BODY.index(b"\r\n\r\n") + 3  # after the blank line's CR
    reads = [BODY[:cut], b"\n", BODY[cut + 1 :], RECEIPT]
    assert _sdk_events(reads) == _sdk_events([BODY + RECEIPT])
    assert _watched(reads) == counts(sdk_shown_usage(BODY + RECEIPT))


def test_an_lf_after_a_lone_cr_blank_line_is_one_for_the_sdk_too() -> None:
    """A CR CR blank line and an LF next: the SDK reads that LF as the CR's line end
    (an empty line, no more), so a following LF is a blank line that dispatches (with the
    `id` set: the SDK raises). The reader must not skip more than the one LF."""
    body = b"id: 7\n" + _usage(1) + b"\r\r\n\n" + _usage(2) + b"\n\n"
    cut = body.index(b"\r\r") + 2
    shown = counts(sdk_shown_usage(body + RECEIPT))
    assert shown is not None and shown["prompt_tokens"] == 1  # the SDK raised before 2
    assert _watched([body[:cut], body[cut:], RECEIPT]) == shown
