"""Where the OpenAI SDK raises mid-stream (stops reading), the reader stops too: the usage
it notes is the last the SDK showed before it raised, never a later one (gateway/api/
sse_events.py, docs/provenance.md "usage"). Held to the installed SDK's own decoder
(`tests/helpers/sdk_stream.py`) on hostile streams cut into random reads: (a) a line that
is not UTF-8 (a comment `: \\xff`, a surrogate, a character cut short at the end; valid
characters split across reads are no stop), (b) an event dispatched without data (a
`retry` with an integer, an `id`, which the SDK keeps, an `event` name), (c) an event
that holds a usage, error or `[DONE]` and whose data is not JSON."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.sse import StreamWatch
from gateway.api.sse_events import EventReader
from tests.helpers.sdk_stream import counts, sdk_shown_usage

TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
WIDE = 'data: {"id":"c","choices":[{"delta":{"content":"é日本🙂"}}]}\n\n'.encode()
DONE = b"data: [DONE]\n\n"


def usage(n: int, extra: bytes = b"") -> bytes:
    return b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":%d}%s}\n\n' % (n, extra)


# A valid character, split across reads, stops nothing; each of these stops the SDK.
NOT_UTF8 = [b": \xff\n", b": \xed\xa0\x80\n", b": \xc0\xaf\n", b'data: {"c":"\xe6\x97"}\n\n']
NO_DATA = [b"retry: 5\n\n", b"retry:\xd9\xa5\n\n", b"id: 1\n\n", b"event: x\n\n"]
NOT_JSON = [
    b"data:  [DONE]\n\n",  # two spaces: the data is " [DONE]"
    b'data: {"usage":{"prompt_tokens":9}\n\n',
    b'data: {"error":\n\n',
    usage(9)[:-1],  # two documents in one event: their join is no JSON
    b'event: thread.run\ndata: {"usage":\n\n',
    'data: \ufeff{"usage":{"prompt_tokens":9}}\n\n'.encode(),  # json.loads(str): no BOM
]
HARMLESS = [
    TOKEN,
    WIDE,
    usage(7, ',"c":"日本"'.encode()),
    b": ping\n",
    b"retry: x\n\n",  # not an integer: not kept, nothing dispatched
    b"id:\n\n",  # an empty id: no dispatch
    b"event:\n\n",
    b"id: a\x00b\n\n",  # an id with NUL is ignored
    b"id: 2\n",  # an id on the next event's lines: every blank line after it dispatches
    b"\n",  # a blank line: dispatches only once an id is set
    b"id\n",  # clears the id
    b"event: thread.x\n" + usage(8),  # nested: shows no usage
    b'data: {"error":null}\n\n',
    b'data: {"error":{"message":"boom"}}\n\n',
]
PARTS = [usage(n) for n in range(1, 6)] + NOT_UTF8 + NO_DATA + NOT_JSON + HARMLESS + [DONE]


def _reads(stream: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def _shown(stream: bytes) -> dict[str, int] | None:
    """What the SDK shows of the stream as the client gets it: the gateway's receipt line
    after it (a line end first when it ends mid-line)."""
    suffix = b"\n" if stream and stream[-1:] not in (b"\n", b"\r") else b""
    return counts(sdk_shown_usage(stream + suffix + b": owngate-receipt x\n\n"))


@given(
    st.lists(st.sampled_from(PARTS), max_size=10),
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.lists(st.integers(min_value=0, max_value=700), max_size=10),
    st.booleans(),
)
@settings(max_examples=1500, deadline=None)
def test_the_usage_noted_is_the_sdk_s_where_it_raises_however_cut(
    parts: list[bytes], ending: bytes, cuts: list[int], cut_short: bool
) -> None:
    stream = b"".join(parts).replace(b"\n", ending)
    if cut_short and stream:  # a character cut short by the stream's end raises too
        stream += "日".encode()[:2]
    reads = _reads(stream, cuts)
    reader = EventReader()
    watch = StreamWatch(strip_usage=False)
    for read in reads:
        reader.feed(read)
        assert watch.feed(read) == read
    reader.finish()
    assert watch.flush() == b""
    watch.end()
    shown = _shown(stream)
    assert reader.usage == shown
    assert watch.usage == shown


@pytest.mark.parametrize("stop", NOT_UTF8 + NO_DATA + NOT_JSON)
@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_each_stop_hides_the_later_usage_at_every_cut(stop: bytes, ending: bytes) -> None:
    stream = (usage(1) + stop + TOKEN + usage(2) + DONE).replace(b"\n", ending)
    assert _shown(stream) == {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 0}
    for cut in range(len(stream)):
        reader = EventReader()
        reader.feed(stream[:cut])
        reader.feed(stream[cut:])
        reader.finish()
        assert reader.usage == _shown(stream), cut
        assert reader.stopped


def test_a_character_split_across_reads_at_every_byte_is_no_stop() -> None:
    stream = WIDE + usage(3, ',"c":"🙂"'.encode()) + WIDE + usage(4) + DONE
    for cut in range(len(stream)):
        reader = EventReader()
        for read in (stream[:cut], stream[cut : cut + 1], stream[cut + 1 :]):
            reader.feed(read)
        reader.finish()
        assert reader.usage == {"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 0}


def test_an_id_makes_every_later_blank_line_an_event() -> None:
    """The SDK never resets the last event id: a second blank line after any later event
    dispatches one without data, and it raises there."""
    stream = b"id: 7\n" + usage(1) + TOKEN + b"\n" + usage(2)
    reader = EventReader()
    for read in (stream[: len(stream) // 2], stream[len(stream) // 2 :]):
        reader.feed(read)
    reader.finish()
    assert (
        reader.usage
        == _shown(stream)
        == {
            "prompt_tokens": 1,
            "completion_tokens": 0,
            "total_tokens": 0,
        }
    )


@pytest.mark.parametrize("stop", NOT_UTF8 + NO_DATA + NOT_JSON)
def test_a_watch_that_strips_the_usage_stops_where_the_sdk_would(stop: bytes) -> None:
    """The gateway asked for the usage the client did not: the watch's usual read (a whole
    event without `"usage"`) goes to `EventReader.whole_without_usage`, which must stop
    where `feed` does (each event its own read, as a paced backend writes them)."""
    events = [usage(1), stop, TOKEN, usage(2), DONE]
    watch = StreamWatch(strip_usage=True)
    for read in events:
        watch.feed(read)
    watch.flush()
    watch.end()
    assert watch.usage == {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 0}
