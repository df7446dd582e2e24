"""`StreamWatch` and `ask_for_usage`: the SSE end, the usage chunk held back, nothing else.

Each stream is fed whole and split at every byte, since a backend's reads cut lines
anywhere.
"""

from __future__ import annotations

import orjson
import pytest

from gateway.api.body import ask_for_usage
from gateway.api.sse import StreamWatch

HEAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":'
ROLE = HEAD + b'[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = HEAD + b'[{"index":0,"delta":{"content":"data: [DONE]"}}]}\n\n'
FINISH = HEAD + b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = HEAD + b'[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}\n\n'
DONE = b"data: [DONE]\n\n"
COUNTS = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


def feed(watch: StreamWatch, stream: bytes, cut: int | None) -> bytes:
    pieces = [stream] if cut is None else [stream[:cut], stream[cut:]]
    return b"".join(watch.feed(piece) for piece in pieces) + watch.flush()


def cuts(stream: bytes) -> list[int | None]:
    return [None, *range(1, len(stream))]


@pytest.mark.parametrize("strip", [False, True])
def test_done_is_seen_only_at_the_start_of_a_line(strip: bool) -> None:
    stream = ROLE + TOKEN + FINISH + DONE
    for cut in cuts(stream):
        watch = StreamWatch(strip_usage=strip)
        assert feed(watch, stream, cut) == stream
        assert watch.done, cut
    for cut in cuts(ROLE + TOKEN):  # the text `data: [DONE]` inside content is no end
        watch = StreamWatch(strip_usage=strip)
        feed(watch, ROLE + TOKEN, cut)
        assert not watch.done, cut


def test_the_usage_chunk_is_held_back_with_its_blank_line_and_counted() -> None:
    for ending in (b"\n", b"\r\n"):
        usage = USAGE.replace(b"\n", ending)
        stream = ROLE + TOKEN + FINISH + usage + DONE
        for cut in cuts(stream):
            watch = StreamWatch(strip_usage=True)
            assert feed(watch, stream, cut) == ROLE + TOKEN + FINISH + DONE, cut
            assert watch.usage == COUNTS and watch.done


def test_without_strip_every_byte_goes_through() -> None:
    stream = ROLE + FINISH + USAGE + DONE
    watch = StreamWatch(strip_usage=False)
    assert feed(watch, stream, None) == stream
    assert watch.usage is None  # the trail reads relayed usage from what it saw


def test_usage_on_a_chunk_with_choices_is_counted_and_kept() -> None:
    finish_with_usage = FINISH[:-3] + b',"usage":{"prompt_tokens":7,"completion_tokens":2,'
    finish_with_usage += b'"total_tokens":9}}\n\n'
    watch = StreamWatch(strip_usage=True)
    assert feed(watch, finish_with_usage + DONE, None) == finish_with_usage + DONE
    assert watch.usage == COUNTS


def test_a_long_line_is_passed_on_not_held() -> None:
    long = b'data: {"choices":[{"delta":{"content":"' + b"x" * 5000 + b'"}}]}\n\n'
    watch = StreamWatch(strip_usage=True, max_line=1024)
    out = [watch.feed(long[i : i + 100]) for i in range(0, len(long), 100)]
    assert b"".join(out) + watch.feed(USAGE) + watch.flush() == long
    assert max(len(piece) for piece in out) <= 1024 + 100  # never more than that held
    assert watch.usage == COUNTS


@pytest.mark.parametrize(
    ("sent", "options"),
    [
        (b' {"model":"m","stream":true}', None),
        (b'{"model":"m","stream":true,"stream_options":{"include_usage":false}}', {}),
        (b'{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}', {}),
        (b'{"model":"m","stream":true,"stream_options":null}', {}),
    ],
)
def test_ask_for_usage(sent: bytes, options: dict[str, object] | None) -> None:
    doc = orjson.loads(sent)
    out = ask_for_usage(sent, doc)
    got = orjson.loads(out)
    assert got["stream_options"]["include_usage"] is True
    assert {k: v for k, v in got.items() if k != "stream_options"} == {
        k: v for k, v in doc.items() if k != "stream_options"
    }
    if options is None:  # spliced: every other byte as sent
        assert out == b' {"stream_options":{"include_usage":true},' + sent[2:]
    else:
        old = doc["stream_options"] or {}
        assert got["stream_options"] == {**old, "include_usage": True}
