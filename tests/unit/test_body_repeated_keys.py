"""The proof that no decided-on key repeats: the string walk must agree with the passes it
replaced for bodies of few quotes, whatever the body holds (escapes, names as values,
nesting, repeats at any level)."""

from __future__ import annotations

import gc
import json
import sys
from unittest import mock

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api import body as body_module
from gateway.api.body import _repeated_keys
from tests.helpers.json_texts import json_texts
from tests.helpers.python_calls import python_steps

_NAMES = ["model", "stream", "stream_options", "include_usage", "messages", "x"]


def _passes(body: bytes) -> list[str]:
    """`_repeated_keys` with the former fast check: one search of the body per name."""
    if b"\\u" not in body and all(body.count(q) < 2 for q in body_module._QUOTED):
        return []
    with mock.patch.object(body_module, "_WALK_STRINGS", -1):  # always the passes
        return _repeated_keys(body)


def _escaped_name(name: str, every: bool) -> str:
    return "".join(f"\\u{ord(c):04x}" if every or i == 0 else c for i, c in enumerate(name))


_key = st.one_of(
    st.sampled_from(_NAMES).map(json.dumps),
    st.sampled_from(_NAMES).flatmap(
        lambda n: st.booleans().map(lambda every: '"' + _escaped_name(n, every) + '"')
    ),
)
_scalar = st.one_of(
    st.sampled_from(_NAMES).map(json.dumps),
    st.text(max_size=20).map(json.dumps),
    st.text(max_size=20).map(lambda t: json.dumps(t, ensure_ascii=False)),
    st.just('"a \\"quoted\\" \\\\\\" word"'),
    st.just(json.dumps("long " * 20 + 'with a "quote" and \\"more\\"')),  # past 84 bytes
    st.integers().map(str),
    st.just("true"),
    st.just("null"),
)


def _object(depth: int) -> st.SearchStrategy[str]:
    return json_texts(_key, _scalar, depth, max_pairs=5)


@given(_object(2))
@settings(max_examples=600, deadline=None)
def test_the_walk_agrees_with_the_passes(text: str) -> None:
    body = text.encode()
    orjson.loads(body)  # the walk is only ever given valid JSON (parse_body parses first)
    assert _repeated_keys(body) == _passes(body)


def test_a_name_repeated_as_a_top_level_key_is_found() -> None:
    assert _repeated_keys(b'{"model":"a","messages":[],"model":"b"}') == ["model"]


def test_a_repeat_spelled_with_escapes_is_found() -> None:
    assert _repeated_keys(b'{"model":"a","m\\u006fdel":"b"}') == ["model"]


def test_long_content_with_escapes_takes_the_walk() -> None:
    content = "\u00e9t\u00e9 " * 500 + '"quoted"'  # escapes all along one long string
    body = json.dumps({"model": "a", "messages": [{"role": "user", "content": content}]})
    assert body.count('"') < body_module._WALK_STRINGS
    assert body_module._no_name_twice(body.encode())


def test_escaped_quotes_in_long_strings_do_not_hide_a_repeat() -> None:
    # Were a `\\"` taken for the end of its string, the walk would fall out of step with
    # the body between two of them and read the repeated keys as what lies between strings.
    before, after = json.dumps("x" * 100 + '"'), json.dumps('"' + "y" * 100)
    body = f'{{"a":{before},"model":1,"model":2,"b":{after}}}'.encode()
    assert not body_module._no_name_twice(body)
    assert _repeated_keys(body) == ["model"]


def _outside_strings(body: bytes, counted: bytes = b"{[") -> int:
    """Reference: the bytes `counted` outside strings, one byte at a time."""
    count, inside, escaped = 0, False, False
    for byte in body:
        if inside:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                inside = False
        elif byte == 0x22:
            inside = True
        elif byte in counted:
            count += 1
    return count


def _commas(body: bytes) -> int:
    """Reference for `BodyScan.commas`: the commas outside strings, counted when the body
    is long (16 KiB) or no stretch before a string is longer than the walk's short-gap
    copy (64 bytes); else -1 (`held_bound` counts them all in one pass)."""
    inside, escaped, closed, longest = False, False, -1, 0
    for at, byte in enumerate(body):
        if inside:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                inside, closed = False, at
        elif byte == 0x22:
            inside, longest = True, max(longest, at - closed)
    if len(body) < 16 * 1024 and longest > 64:
        return -1
    return _outside_strings(body, b",")


@given(_object(3))
@settings(max_examples=300, deadline=None)
def test_the_scan_counts_the_brackets_outside_strings(text: str) -> None:
    body = text.encode()
    scan = body_module.scan_body(body)
    if scan is not None:  # more strings than it walks: the caller counts them all
        assert scan.brackets == _outside_strings(body)
        assert scan.commas == _commas(body)


def test_brackets_in_a_string_do_not_count_as_nesting() -> None:
    body = json.dumps({"model": "m", "messages": [{"content": "{[," * 6000}]}).encode()
    scan = body_module.scan_body(body)
    assert scan is not None and scan.brackets == 3 and scan.commas == 1


def _padded(text: str) -> str:
    """`text` with whitespace and an array of numbers after each `:` and `,`, so that
    the stretches between strings run past the walk's short-gap copy (64 bytes)."""
    return text.replace(":", ": " + " " * 70).replace(",", ", [" + "1," * 40 + "1], ")


@given(_object(3).map(_padded), st.booleans())
@settings(max_examples=200, deadline=None)
def test_long_stretches_between_strings_are_counted_where_they_are(
    text: str, long_body: bool
) -> None:
    body = text.encode()
    if long_body:  # commas counted too
        body = body[:-1] + (b',"pad":' + b" " * 16 * 1024 + b"}" if len(body) > 2 else b"}")
    scan = body_module.scan_body(body)
    if scan is not None:
        assert scan.brackets == _outside_strings(body)
        assert scan.commas == _commas(body)


def test_a_chat_body_s_commas_are_counted_by_its_walk() -> None:
    # A chat body of short stretches between its strings (the usual one) has its commas
    # counted by the walk: `held_bound` needs no pass of its own over all of it.
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "a, b, " * 150}], "n": 1}
    ).encode()
    scan = body_module.scan_body(body)
    assert scan is not None and scan.commas == 3 and scan.brackets == 3
    assert body_module.held_bound(body, scan) == body_module.held_bound(body, None) - 300 * 320


def test_the_scan_does_not_search_or_count_per_short_stretch() -> None:
    """The stretches between strings are counted in one piece: the C-level searches and
    counts of a scan grow by two per string (its quotes), not by five."""

    def calls(strings: int) -> int:
        body = json.dumps({f"k{i}": f"v{i}" for i in range(strings)}).encode()
        made: list[str] = []

        def profile(_frame: object, event: str, arg: object) -> None:
            if event == "c_call" and isinstance(getattr(arg, "__self__", None), bytes):
                made.append(getattr(arg, "__name__", "?"))

        sys.setprofile(profile)
        try:
            body_module.scan_body(body)
        finally:
            sys.setprofile(None)
        return len(made)

    assert calls(40) - calls(20) == 2 * 40  # 20 more pairs: 40 more strings, two quotes each


def test_the_exact_check_makes_no_python_call_per_object() -> None:
    """A body whose nested objects repeat a decided-on name (`[{"model":1},...]`) takes
    the exact check; its cost must not grow by a Python call per object or per written
    name. A hook per object (about 4 us each) and a decode per name held the event loop
    3 s for one 8 MiB body that any tenant may send."""

    def calls(objects: int) -> int:
        body = b'{"model":"m","x":[' + b'{"model":1},' * objects + b'{"model":1}]}'
        made = 0

        def profile(_frame: object, event: str, _arg: object) -> None:
            nonlocal made
            made += event in ("call", "c_call")

        gc.disable()  # no finalizer of another test's objects runs in between
        sys.setprofile(profile)
        try:
            body_module.parse_body(body)
        finally:
            sys.setprofile(None)
            gc.enable()
        return made

    assert calls(4000) == calls(2000)  # both past json_loads.COLLECT_UNDER by length


def test_a_repeat_inside_stream_options_is_found_and_nested_ones_are_not() -> None:
    body = b'{"model":"a","stream_options":{"include_usage":true,"include_usage":false}}'
    assert _repeated_keys(body) == ["stream_options.include_usage"]
    nested = b'{"model":"a","x":[{"model":1,"model":2},{"stream_options":{},"stream_options":1}]}'
    assert _repeated_keys(nested) == []
    deeper = b'{"model":"a","x":{"stream_options":{"include_usage":1,"include_usage":2}}}'
    assert _repeated_keys(deeper) == []


def _steps_of_scan(body: bytes) -> int:
    """The Python lines run and functions called (C ones too) while `scan_body(body)` runs."""
    return python_steps(lambda: body_module.scan_body(body))


@pytest.mark.parametrize(
    "unit",
    [b'\\"', b'\\\\\\\\\\\\\\"', b'{\\"a\\": \\"b\\\\\\"\\"}, '],
    ids=["escaped-quotes", "backslashes-then-a-quote", "json-in-a-prompt"],
)
def test_a_string_of_escaped_quotes_costs_no_python_step_each(unit: bytes) -> None:
    """The end of a string holding `\\"` (or `\\\\`) is found in C, whatever its escapes.
    The walk took a Python loop turn and a call per escaped quote, and a turn per
    backslash before one: 2.6 s of the event loop (CPU time) for one 8 MiB chat body of
    `\\"`, against orjson's 0.03 s for its parse; a prompt quoting JSON pays the same."""

    def body(units: int) -> bytes:
        content = b'"' + unit * units + b'"'
        return b'{"model":"m","messages":[{"role":"user","content":' + content + b"}]}"

    assert body_module.scan_body(body(3)) is not None
    more, fewer = _steps_of_scan(body(4000)), _steps_of_scan(body(2000))
    assert more == fewer


_quoting = st.text(alphabet='\\"{[,:a', max_size=40).map(json.dumps)


@given(json_texts(_key, _quoting, 2, max_pairs=5))
@settings(max_examples=300, deadline=None)
def test_strings_of_backslashes_and_quotes_end_where_json_ends_them(text: str) -> None:
    body = text.encode()
    scan = body_module.scan_body(body)
    if scan is not None:
        assert scan.brackets == _outside_strings(body)
        assert scan.colons == _outside_strings(body, b":")
        assert not (scan.once and _passes(body))  # `once` proves no repeat
