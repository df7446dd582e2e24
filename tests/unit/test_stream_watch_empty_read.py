"""An empty read fed to `StreamWatch` (a read that was all a stripped comment, the relay's
flushes at a stream's end) changes nothing: what is relayed, the usage and `[DONE]`."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.sse import StreamWatch

_USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}'
_TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}'


def _relay(reads: list[bytes], *, strip: bool) -> tuple[bytes, object, bool]:
    watch = StreamWatch(strip_usage=strip, find_done=True)
    out = b"".join(watch.feed(read) for read in reads) + watch.flush()
    watch.end()
    return out, watch.usage, watch.done


def test_an_empty_read_between_a_held_back_event_s_cr_and_lf_adds_no_blank_line() -> None:
    """Strip mode: a usage chunk ending in CRLF CR (its blank line's LF in the next read)
    is held back, and the LF that starts the next read is dropped with it. An empty read
    between them went through the whole event split and forgot that LF: what was relayed
    depended on where the watch's input was cut (one blank line more)."""
    reads = [_USAGE + b"\r\n\r", b"\n" + _TOKEN + b"\n\n"]
    want = _relay(reads, strip=True)
    assert want[0] == _TOKEN + b"\n\n"
    assert _relay([reads[0], b"", reads[1]], strip=True) == want


_PARTS = st.sampled_from(
    [_TOKEN + b"\n\n", _TOKEN + b"\r\n\r\n", _USAGE + b"\n\n", _USAGE + b"\r\n\r\n", b": c\n"]
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_PARTS, min_size=1, max_size=6),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=6),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=4),
)
def test_empty_reads_anywhere_change_nothing(
    parts: list[bytes], strip: bool, cuts: list[int], empties: list[int]
) -> None:
    stream = b"".join(parts) + b"data: [DONE]\r\n\r\n"
    at = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    reads = [stream[a:b] for a, b in itertools.pairwise(at) if b > a]
    with_empty = list(reads)
    for e in sorted(empties, reverse=True):
        with_empty.insert(e % (len(with_empty) + 1), b"")
    assert _relay(with_empty, strip=strip) == _relay(reads, strip=strip)
