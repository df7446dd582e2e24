"""Whatever the reads a stream arrives in (coalesced, or cut anywhere), the stream watch
records the usage the client's SDK showed and whether it raised at the backend's error
event, stopping where the SDK raises at an event whose data is not JSON, one that holds
nothing the reader used to search for (`data: {x`) included (gateway/api/sse_events.py:
every event is parsed). Seeded random cuts, bounded in count; each stream is also held to
itself read whole, and in strip mode to the bytes and record of the uncut stream."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from gateway.api.sse import StreamWatch
from tests.helpers.sdk_stream import counts, sdk_shown_usage

HEAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":'
TOKEN = HEAD + b'[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def _usage(n: int) -> bytes:
    counts = b'{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d}' % (n, n + 1)
    return HEAD + b'[],"usage":' + counts + b"}\n\n"


# Events the SDK refuses that hold none of `"usage"`, `"error"`, `[DONE]`, a letter escape
# or a field name: the searches that picked the events to parse could not see them.
NOT_JSON = [
    b"data: {x\n\n",
    b"data: x\n\n",
    b'data: {"a":1}{\n\n',
    b"data: \n\n",
    b'data: {"a":\ndata: 1\ndata: x\n\n',  # lines joined with LF: still not JSON
    b"data: {x\r\n\r\n",
    b": ping\ndata: {x\n\n",
]
# Events the SDK reads, shown nothing: their reading must not stop the record.
FINE = [
    TOKEN,
    b'data: {"a":\ndata: 1}\n\n',  # two lines joining to JSON
    b": ping\n\n",
    TOKEN.replace(b"\n", b"\r\n"),
    b"data: [1,2]\n\n",
]
SEEDS = range(40)  # streams, each cut 25 ways: 1,000 relays


ERROR = b'data: {"error":{"message":"overloaded"}}\n\n'


def _stream(rng: random.Random) -> tuple[bytes, bool]:
    """A stream, and whether the SDK raises at its backend's error event (half of them
    end with one: the SDK reaches it only if no event before it was refused)."""
    events = [_usage(1)]
    refused = False
    for n in range(2, 2 + rng.randrange(2, 6)):
        events += rng.choices(FINE, k=rng.randrange(0, 4))
        if rng.random() < 0.3:
            events.append(rng.choice(NOT_JSON))
            refused = True
        events.append(_usage(n))
    error = rng.random() < 0.5
    if error:
        events.append(ERROR)
    return b"".join([*events, b"data: [DONE]\n\n"]), error and not refused


def _cuts(rng: random.Random, body: bytes) -> list[bytes]:
    marks = sorted(rng.sample(range(1, len(body)), rng.randrange(0, min(12, len(body) - 1))))
    bounds = [0, *marks, len(body)]
    return [body[a:b] for a, b in pairwise(bounds)]


def _relay(reads: list[bytes], *, strip: bool) -> tuple[bytes, object, bool]:
    watch = StreamWatch(strip_usage=strip)
    out = [watch.feed(read) for read in reads]
    out.append(watch.flush())
    watch.end()
    return b"".join(out), watch.usage, watch.error_event


@pytest.mark.parametrize("seed", SEEDS)
def test_the_record_s_usage_is_the_sdk_s_whatever_the_reads(seed: int) -> None:
    rng = random.Random(seed)
    body, error_event = _stream(rng)
    shown = counts(sdk_shown_usage(body))
    assert _relay([body], strip=False)[1:] == (shown, error_event)
    for _ in range(25):
        reads = _cuts(rng, body)
        assert _relay(reads, strip=False)[1:] == (shown, error_event), reads


@pytest.mark.parametrize("seed", SEEDS)
def test_strip_mode_relays_and_records_the_same_whatever_the_reads(seed: int) -> None:
    rng = random.Random(seed)
    body, error_event = _stream(rng)
    whole = _relay([body], strip=True)
    # The usage chunks are usage-only (`"choices":[]`): held back from the client, their
    # counts recorded up to where its SDK stops (as it would have shown them).
    assert whole[1:] == (counts(sdk_shown_usage(body)), error_event)
    for _ in range(25):
        assert _relay(_cuts(rng, body), strip=True) == whole
