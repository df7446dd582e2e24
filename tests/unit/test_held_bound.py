"""`held_bound`: what a request holds for its body (the bytes, a re-encoded copy, the
parsed document), bounded before parsing, for the hostile shapes that amplify most.

Measured with tracemalloc: what `parse_body` leaves allocated while its document is alive
(its transient buffers are freed when it returns: one parse runs at a time per process)."""

from __future__ import annotations

import gc
import itertools
import json
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.body import MAX_DEPTH, held_bound, parse_body, scan_body
from gateway.config.schema import LimitSettings
from gateway.errors import GatewayError

SIZE = 256 * 1024


@pytest.fixture(autouse=True)
def _frozen_heap() -> Iterator[None]:
    """What earlier tests left in this process out of the collector's walks: each
    measurement runs `gc.collect()` twice, and in the whole suite's process (~1 GB of
    objects by the time this module runs) each full collection walked all of it: 150
    generated documents took minutes there, seconds alone. The objects a measurement
    makes are not frozen, so its collections still free their cycles."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _array(make: Callable[[], bytes], size: int = SIZE) -> bytes:
    parts, total = [], 0
    while total < size:
        part = make()
        parts.append(part)
        total += len(part) + 1
    return b"[" + b",".join(parts) + b"]"


def _bound(body: bytes) -> int:
    """The smaller of the two ways `held_bound` counts: outside the strings a walk found
    (few strings), or every bracket and comma (many): each must cover alone."""
    walked = scan_body(body)
    whole = held_bound(body, None)
    return whole if walked is None else min(whole, held_bound(body, walked))


def _names() -> Iterator[bytes]:
    return (b"%x" % i for i in itertools.count())


def _nested_new_keys(names: Iterator[bytes], depth: int = MAX_DEPTH - 8) -> bytes:
    """One-member objects nested `depth` deep, each under a name not seen before."""
    return b"".join(b'{"' + next(names) + b'":' for _ in range(depth)) + b"0" + b"}" * depth


def _escaped_new_keys(names: Iterator[bytes], depth: int = MAX_DEPTH - 8) -> bytes:
    """The same with one-character names written as `\\uXXXX` escapes (UCS-2 strings)."""
    keys = (b"\\u%04x" % (0x100 + int(next(names), 16) % 0xD000) for _ in range(depth))
    return b"".join(b'{"' + k + b'":' for k in keys) + b"0" + b"}" * depth


def _shapes() -> dict[str, bytes]:
    names = _names()
    logit_bias = b",".join(b'"%d":%d' % (i, i % 200 - 100) for i in range(1 << 20))
    prose = "Hello, world, said the client, and then, after a pause, it sent [more], {more}. "
    return {
        "empty objects": _array(lambda: b"{}"),
        "empty arrays": _array(lambda: b"[]"),
        "one-member objects": _array(lambda: b'{"":{}}'),
        "one member, new names": _array(lambda: b'{"' + next(names) + b'":0}'),
        "nested arrays, depth 126": _array(lambda: b"[" * 126 + b"]" * 126),
        "nested objects": _array(lambda: b'{"a":' * 120 + b"1" + b"}" * 120),
        "nested objects, new names": _array(lambda: _nested_new_keys(names)),
        "nested objects, escaped names": _array(lambda: _escaped_new_keys(names)),
        "objects of 6 new names": _array(
            lambda: b"{" + b",".join(b'"' + next(names) + b'":"v"' for _ in range(6)) + b"}"
        ),
        "short strings": _array(lambda: b'"ab"'),
        "empty strings": _array(lambda: b'""'),
        "floats": _array(lambda: b"0.5"),
        "floats that grow re-encoded": _array(lambda: b"5e15"),
        "ints": _array(lambda: b"1000"),
        "64-bit ints": _array(lambda: b"-9223372036854775807"),
        "true, false, null": _array(lambda: b"true,false,null"),
        "ASCII then one astral escape": b'["' + b"a" * SIZE + b'\\ud83d\\ude00"]',
        "ASCII then one astral character": ('["' + "a" * SIZE + '\U0001f600"]').encode(),
        "astral strings": _array(lambda: '"a\U0001f600"'.encode()),
        "escaped astral strings": _array(lambda: b'"\\ud83d\\ude00"'),
        "two-byte characters": _array(lambda: '"\u00e9"'.encode()),
        "CJK": _array(lambda: '"\u4e2d"'.encode()),
        "logit_bias of 1M keys": b'{"logit_bias":{' + logit_bias + b"}}",
        "prose with many commas": orjson.dumps(
            {"messages": [{"role": "user", "content": prose * (SIZE // len(prose))}]}
        ),
        "many messages": orjson.dumps({"messages": [{"role": "user", "content": "hi"}] * 8000}),
    }


SHAPES = _shapes()


def _held(value: bytes) -> int:
    """Bytes held for `value` sent as a request: the body, the document parsed from it
    (what tracemalloc sees still allocated after `parse_body`) and a re-encoded copy."""
    body = b'{"model":"m","x":' + value + b"}"
    # tracemalloc counts every thread's allocations: a thread an earlier test left running
    # in this process (a server winding down) adds its own to one measurement (10 KB to
    # `[null]`'s, once). Such noise only adds: the least of three is the parse's.
    measured = []
    for _ in range(3):
        gc.collect()
        tracemalloc.start()
        try:
            doc = parse_body(body)
            # What the document holds, not the cyclic garbage a parse leaves for the
            # collector (the standard library's decoder, run again for a 19-digit run:
            # ~1.5 KB until the next collection, counted as held before).
            gc.collect()
            measured.append(tracemalloc.get_traced_memory()[0])
        finally:
            tracemalloc.stop()
        del doc
    return len(body) + min(measured) + len(orjson.dumps(parse_body(body)))


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_bound_covers_what_hostile_shapes_hold(name: str) -> None:
    value = SHAPES[name]
    body = b'{"model":"m","x":' + value + b"}"
    assert _held(value) <= _bound(body)


PROSE = (
    "What all connections together hold in request bodies, and in what is parsed from "
    "them, is bounded too, after the key is checked: one body is bounded by its limit, "
    "and what a process holds for bodies at once by the budget, across tenants. A request "
    "reserves its declared length before any of its body is read; once the body is whole, "
    "and before it is parsed, the reservation grows to an upper bound of what it holds. "
)


def test_max_size_prose_bodies_fit_the_default_budget_many_times() -> None:
    limits = LimitSettings()
    text = PROSE * (limits.max_body_bytes // len(PROSE) - 1)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    assert len(body) <= limits.max_body_bytes
    assert held_bound(body, scan_body(body)) * 8 <= limits.max_held_body_bytes


def test_prose_is_charged_for_its_characters_not_for_its_commas() -> None:
    # A chat body of few strings is counted outside them: its commas make no objects.
    text = PROSE * 200
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    assert held_bound(body, scan_body(body)) <= 4 * len(body)
    # With a newline escaped, its characters may be up to 4 bytes: still no comma counted.
    escaped = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text + "\n"}]})
    assert held_bound(escaped, scan_body(escaped)) <= 7 * len(escaped)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=6)
    ),
    max_leaves=40,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_JSON, min_size=1, max_size=200), st.booleans())
def test_the_bound_covers_generated_documents(values: list[Any], ascii_only: bool) -> None:
    value = json.dumps(values, ensure_ascii=ascii_only).encode()
    body = b'{"model":"m","x":' + value + b"}"
    assert _held(value) <= _bound(body)


@pytest.mark.parametrize("item", [b"{}", b'{"a":{}}', b'{"model":1}', b'{"model":1,"model":1}'])
def test_the_exact_repeat_check_holds_little_more_than_the_parse(item: bytes) -> None:
    """A body that names `model` twice takes the exact check (a second, stdlib parse)
    while the document is alive: each object as the tuple of its pairs."""
    body = b'{"model":"m","x":' + _array(lambda: item) + b',"y":{"model":1}}'
    gc.collect()
    tracemalloc.start()
    try:
        with pytest.raises(GatewayError):  # `model` twice in the top object? no: refused
            parse_body(body.replace(b',"y":{"model":1}}', b',"model":"n"}'))
        if item.count(b'"model"') > 1:  # a repeat in a nested object: refused too
            with pytest.raises(GatewayError, match="repeats a name"):
                parse_body(body)
        else:
            parse_body(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # orjson's own parse peaks at the document plus 12 bytes per body byte (about 37x
    # for `[{},...]`); whole objects in the check took 240x.
    assert peak < 64 * len(body)
