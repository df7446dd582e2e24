"""`read_json` and `utf8_document` (gateway/api/usage_read.py): a usage document read as
the client's parser reads it, within bounds that keep one answer from stalling the event
loop: nested past `MAX_DEPTH` is none on every path, the standard library reads no
document orjson refuses past `MAX_FALLBACK` bytes, and a whole answer in UTF-16 or
UTF-32 is decoded as `json.loads(bytes)` decodes it."""

from __future__ import annotations

import gc
import json
import tracemalloc

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api.sse import StreamWatch
from gateway.api.sse_events import EventReader
from gateway.api.trail import Trail
from gateway.api.usage_read import (
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_FALLBACK,
    PastBounds,
    read_json,
    utf8_document,
)
from gateway.provenance import Salts

USAGE = b'"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}'
COUNTS = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def unreadable(data: bytes, *, line: bool = False) -> bool:
    """Whether `read_json` finds no document in `data` (its ValueError)."""
    try:
        read_json(data, line=line)
    except ValueError:
        return True
    return False


def nested(depth: int, *, extra: bytes = b"") -> bytes:
    """A usage document whose arrays and objects nest `depth` deep (the top object one)."""
    return b"{" + USAGE + b',"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + extra + b"}"


def test_orjson_refuses_past_the_depth_the_wrap_counts_on() -> None:
    # usage_read wraps a document in arrays to bound its depth with orjson's own limit.
    orjson.loads(b"[" * 1024 + b"]" * 1024)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(b"[" * 1025 + b"]" * 1025)


@pytest.mark.parametrize("line", [False, True])
def test_a_document_at_the_depth_bound_is_read_and_past_it_is_none(line: bool) -> None:
    assert read_json(nested(MAX_DEPTH), line=line)["usage"] == COUNTS
    for depth in (MAX_DEPTH + 1, 1000, 1024, 1100):
        assert unreadable(nested(depth), line=line)


@pytest.mark.parametrize("line", [False, True])
def test_past_the_depth_bound_is_none_also_where_orjson_refuses(line: bool) -> None:
    # NaN: the standard library's path, which must not read what orjson's would not.
    assert read_json(nested(MAX_DEPTH, extra=b',"n":NaN'), line=line)["usage"] == COUNTS
    assert unreadable(nested(MAX_DEPTH + 1, extra=b',"n":NaN'), line=line)


def test_brackets_in_strings_are_no_depth() -> None:
    text = b'"' + b"[{" * 2000 + b'"'
    doc = b"{" + USAGE + b',"x":[' + text + b"]," + b'"y":' + text + b"}"
    assert read_json(doc)["usage"] == COUNTS
    assert read_json(doc[:-1] + b',"n":NaN}')["usage"] == COUNTS


@given(
    st.recursive(
        st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(alphabet='[]{}"\\ab'),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(alphabet="[]{}ab", max_size=3), inner, max_size=3)
        ),
        max_leaves=600,
    )
)
def test_a_document_under_the_bound_reads_as_json_loads_reads_it(doc: object) -> None:
    data = json.dumps(doc).encode()
    padded = b"[" * 600 + b"]" * 600  # enough brackets to take the bounded path
    whole = b'{"d":' + data + b',"p":' + b"[" * 10 + b"]" * 10 + b',"s":"' + padded + b'"}'
    assert read_json(whole) == json.loads(whole)


@pytest.mark.parametrize(
    "bytes_", [b"", b"1],[2", b"]", b"[", b"{}]", b"[{}", b" ", b'{"a":1}]],[[{"b":2}']
)
def test_what_is_not_one_document_stays_none_when_wrapped(bytes_: bytes) -> None:
    data = bytes_ + b" " + b"[]" * MAX_DEPTH  # past the count: the wrapped path
    with pytest.raises(json.JSONDecodeError):
        json.loads(data)
    assert unreadable(data)


def test_the_standard_library_reads_no_long_document() -> None:
    short = b"{" + USAGE + b',"x":[' + b"1.5," * 1000 + b"NaN]}"
    assert read_json(short)["usage"] == COUNTS
    long = b"{" + USAGE + b',"x":[' + b"1.5," * (MAX_FALLBACK // 4) + b"NaN]}"
    assert json.loads(long)["usage"] == COUNTS  # the client reads it; the recorder not
    assert unreadable(long)


@pytest.mark.parametrize(
    "codec",
    ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"],
)
def test_a_whole_answer_is_decoded_as_json_loads_decodes_it(codec: str) -> None:
    text = '{"a":"é\U0001f600",' + USAGE.decode() + "}"
    data = text.encode(codec)
    assert read_json(utf8_document(data)) == json.loads(data)
    trail = Trail(Salts.generate(), "")
    trail.answered(data)
    usage = trail.usage()
    assert usage is not None and usage.total_tokens == 8


def test_what_json_loads_cannot_decode_is_no_whole_answer() -> None:
    for data in ('{"a":1}'.encode("utf-16-le")[:-1], b"\xff\xfe\xff\xfe{\x00}\x00"):
        with pytest.raises((UnicodeDecodeError, json.JSONDecodeError)):
            json.loads(data)
        with pytest.raises((UnicodeDecodeError, json.JSONDecodeError)):
            utf8_document(data)


def test_a_stream_event_past_the_depth_bound_makes_the_usage_unknown() -> None:
    """Nested 513 to about 1000 deep, the client's `json.loads` reads a usage the record
    does not (its bound); the record kept the earlier, smaller usage (found by review:
    900 + 900 tokens shown, 1 + 1 recorded). Now it states none: the tenant is charged
    the byte estimate (docs/provenance.md), never an older chunk's counts."""
    reader = EventReader()
    reader.feed(b"data: " + nested(3) + b"\n\n")
    deeper = nested(MAX_DEPTH + 1).replace(b'"total_tokens":8', b'"total_tokens":9')
    assert json.loads(deeper)["usage"]["total_tokens"] == 9  # what the client reads
    reader.feed(b"data: " + deeper + b"\n\n")
    reader.finish()
    assert reader.usage is None
    assert reader.unknown


def test_a_usage_read_after_an_unknown_one_is_the_usage() -> None:
    reader = EventReader()
    reader.feed(b"data: " + nested(MAX_DEPTH + 1) + b"\n\n")
    reader.feed(b"data: " + nested(3) + b"\n\n")
    reader.finish()
    assert reader.usage == COUNTS
    assert not reader.unknown


def test_a_held_back_usage_is_not_recorded_past_an_unknown_one() -> None:
    """Strip mode (a client that did not ask for usage): a usage-only chunk held back,
    then one past the depth bound the gateway does not hold (it cannot read it) and the
    client's parser shows: the record states none, not the held chunk's counts."""
    watch = StreamWatch(strip_usage=True)
    held = b'data: {"choices":[],' + USAGE + b"}\n\n"
    assert watch.feed(held) == b""  # held back from the client
    deep = b'data: {"choices":[],' + nested(MAX_DEPTH + 1)[1:] + b"\n\n"
    assert watch.feed(deep) == deep  # not read, so not held: the client reads it
    assert watch.usage is None


def test_a_stream_tail_past_the_depth_bound_states_no_earlier_usage() -> None:
    """The tail of a stream no watch read (its client left): the last usage line past the
    bound makes the usage unknown, where an earlier line was taken."""
    trail = Trail(Salts.generate(), "")
    trail.relayed(b"data: " + nested(3) + b"\n\ndata: " + nested(MAX_DEPTH + 1) + b"\n\n")
    assert trail.usage() is None


def test_a_stream_event_past_the_fallback_bound_makes_the_usage_unknown() -> None:
    """The other bound: a document orjson refuses (NaN) over `MAX_FALLBACK` bytes."""
    reader = EventReader(max_event=2 * MAX_FALLBACK)
    reader.feed(b"data: " + nested(3) + b"\n\n")
    pad = b',"p":"' + b"x" * MAX_FALLBACK + b'","n":NaN}'
    reader.feed(b"data: " + nested(3)[:-1] + pad + b"\n\n")
    reader.finish()
    assert reader.usage is None


def test_a_document_of_many_containers_is_read_without_a_collection() -> None:
    """A whole answer of millions of empty arrays (16 MiB of `[[],[],...]`): each array
    orjson made counted toward the next garbage collection, which ran over and over on
    the event loop (the parse took seconds). Counted, not timed: at most the one
    collection that is due once the collector is on again (hundreds ran before)."""
    usage = b'{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}'
    doc = b'{"x":[' + b"[]," * 200_000 + b'[]],"usage":' + usage + b"}"
    collections: list[str] = []

    def counted(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(phase)

    expected = json.loads(usage)
    gc.callbacks.append(counted)
    try:
        read = read_json(doc)
    finally:
        gc.callbacks.remove(counted)
    assert read["usage"] == expected
    assert len(collections) <= 1
    assert gc.isenabled()


def test_a_document_past_the_container_bound_is_none_and_not_built() -> None:
    """A whole answer of more arrays and objects than `MAX_CONTAINERS` (a hostile backend's
    15 MiB of `[],[],...` took 510 MB and 0.9 s of the event loop) is past the bounds:
    none of its values is built (tracemalloc's peak stays within two copies of its bytes,
    where its 262,145 objects took some 20 times its size), and
    its usage is unknown. Brackets in strings do not count: a long answer of code is read."""
    over = b"{" + USAGE + b',"x":[' + b"{}," * MAX_CONTAINERS + b"0]}"
    tracemalloc.start()
    try:
        with pytest.raises(PastBounds):
            read_json(over)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(over), f"{peak} bytes built for a {len(over)}-byte document"
    code = b'{"c":"' + b"[{" * MAX_CONTAINERS + b'",' + USAGE + b"}"
    assert read_json(code)["usage"] == COUNTS
    # Many strings too (taking them out would build a piece each): past the bound.
    quoted = b'{"x":[' + b'{"a":[]},' * MAX_CONTAINERS + b"0]," + USAGE + b"}"
    assert unreadable(quoted)
    at_bound = b"{" + USAGE + b',"x":[' + b"{}," * (MAX_CONTAINERS - 3) + b"0]}"
    assert read_json(at_bound)["usage"] == COUNTS
