"""No object of a request body may repeat a name (gateway/api/body_names.py): the gateway
(orjson) reads the last copy, a router in Go or another parser may read the first or
each in turn, so `{"store": true, "store": null}` was a stored completion to such a
router behind a body the gateway judged unstored. The fast proof (colons outside strings
counted on the body and on its re-encoding) must agree with the exact check for every
body, walked or not, whatever its strings hold (colons, escaped colons, quotes)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api import body_names
from gateway.api.body import parse_body, scan_body
from gateway.errors import GatewayError
from tests.helpers.json_texts import json_texts

ASK = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]'


def refused(body: bytes, walked: bool = True) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_body(body, scan_body(body) if walked else None)
    assert (caught.value.status, caught.value.code.value) == (400, "invalid_request")
    return caught.value


@pytest.mark.parametrize("walked", [True, False])
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # the hosted rule reads the last copy (null: unstored); Go keeps `true`
        (b'"store": true, "store": null', "store"),
        (b'"web_search_options": {}, "web_search_options": null', "web_search_options"),
        (b'"temperature": 1, "temperature": 2', "temperature"),
        # nested: a message, a content part, a tool, metadata, response_format
        (
            b'"tools": [{"type": "function", "function": {"name": "f", "name": "g"}}]',
            "tools[0].function.name",
        ),
        (b'"metadata": {"tags": ["a"], "tags": null}', "metadata.tags"),
        (
            b'"response_format": {"type": "json_schema", "type": "text"}',
            "response_format.type",
        ),
        (b'"response_format": {"json_schema": {"schema": {}, "schema": {}}}',
         "response_format.json_schema.schema"),
    ],
)  # fmt: skip
def test_a_repeated_name_anywhere_is_refused(extra: bytes, param: str, walked: bool) -> None:
    error = refused(ASK + b", " + extra + b"}", walked)
    assert error.param == param


@pytest.mark.parametrize("walked", [True, False])
def test_a_repeat_in_a_message_or_a_content_part_is_named_by_position(walked: bool) -> None:
    part = b'{"type": "image_url", "image_url": {"url": "http://a/x.png", "url": "http://b/"}}'
    body = b'{"model": "m", "messages": [{"role": "user", "content": [' + part + b"]}]}"
    assert refused(body, walked).param == "messages[0].content[0].image_url.url"
    body = b'{"model": "m", "messages": [{"role": "user", "content": "a", "role": "system"}]}'
    assert refused(body, walked).param == "messages[0].role"


def test_a_name_of_the_clients_own_is_not_echoed() -> None:
    body = ASK + b', "metadata": {"secret_key_name": {"leak": 1, "leak": 2}}}'
    error = refused(body)
    assert error.param == "metadata"
    assert "secret_key_name" not in error.message and "leak" not in error.message
    assert "inside `metadata`" in error.message
    error = refused(ASK + b', "my_own": 1, "my_own": 2}')
    assert error.param is None and "my_own" not in error.message


@pytest.mark.parametrize(
    "body",
    [
        # the same name in different objects, a name as a value, colons in strings
        ASK[:-1] + b', {"role": "assistant", "content": "a: b"}]}',
        b'{"model": "m", "prompt": "key: \\"value\\": x", "x": {"model": 1}}',
        # an escaped colon in a name or a text: the exact check decides, and passes
        b'{"model": "m", "a\\u003a": 1, "b:": 2, "prompt": "\\u003A"}',
        b'{"model": "m", "a\\u0061": 1, "ab": 2}',
    ],
)
def test_names_once_per_object_pass(body: bytes) -> None:
    for walked in (True, False):
        assert parse_body(body, scan_body(body) if walked else None)["model"] == "m"


def _repeats(body: bytes) -> bool:
    """Reference: whether any object of `body` repeats a name, by a recursive pairs parse."""
    found = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        found = found or len(Counter(k for k, _ in items)) != len(items)
        return dict(items)

    json.loads(body, object_pairs_hook=pairs)
    return found


_NAMES = [
    *("a", "b", "a:", "a\\u003a", "a\\\\u003a", "a\\\\\\u003A", "\\u0061", 'q\\"'),
    *("model", "store", "\u00e9:", "\\u00e9:"),
]
_key = st.sampled_from(_NAMES).map(lambda n: f'"{n}"')
_scalar = st.one_of(
    st.text(max_size=12).map(json.dumps),
    st.text(max_size=12).map(lambda t: json.dumps(t, ensure_ascii=False)),
    st.text(alphabet=':"\\ab', max_size=8).map(json.dumps),
    st.just('"\\u003a: \\u003A"'),
    st.just('"\\\\u003a \\\\\\u003a \\u0030"'),  # text, then an escaped colon; a digit
    st.just(json.dumps("long text: " * 12 + '"quoted": yes')),
    st.integers().map(str),
    st.just("null"),
)


def _object(depth: int) -> st.SearchStrategy[str]:
    return json_texts(_key, _scalar, depth, max_pairs=4)


@given(_object(3), st.booleans(), st.booleans())
@settings(max_examples=800, deadline=None)
def test_the_fast_proof_agrees_with_the_exact_check(text: str, walked: bool, long: bool) -> None:
    body = text.encode()
    if long:  # past the size where a walked body's re-encoding is walked too
        body = b'{"pad": "' + b"x" * body_names._SMALL + b'", "doc": ' + body + b"}"
    doc = orjson.loads(body)
    scan = scan_body(body) if walked else None
    try:
        if scan is None:
            body_names.check_unique_names(body, doc)
        else:
            body_names.check_unique_names(body, doc, scan.colons)
    except GatewayError:
        assert _repeats(body)
    else:
        assert not _repeats(body)


def test_a_name_spelled_with_an_escape_is_the_same_name() -> None:
    assert refused(b'{"model": "m", "a\\u003a": 1, "a:": 2}').param is None
    assert refused(b'{"model": "m", "st\\u006fre": true, "store": null}').param == "store"


def test_the_scan_counts_the_members() -> None:
    body = b'{"a": "x: y", "b": {"c\\":": [1, {"d": ":"}]}}'
    scan = scan_body(body)
    assert scan is not None and scan.colons == 4
    assert body_names._members(orjson.loads(body)) == 4


class _Walks:
    """Counts the exact check's parses (`_first_repeat`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        exact = body_names._first_repeat

        def counted(body: bytes) -> Any:
            self.calls += 1
            return exact(body)

        monkeypatch.setattr(body_names, "_first_repeat", counted)


_MANY = b",".join([b'{"a": 1, "b": [1, 2]}'] * 20_000)  # ~440 KB of small objects


@pytest.mark.parametrize("walked", [True, False])
def test_an_escape_that_is_no_colon_costs_no_exact_check(
    monkeypatch: pytest.MonkeyPatch, walked: bool
) -> None:
    """Before, any `\\u003` in a body (`\\u0030`, a digit) sent it to the exact check:
    a parse keeping every pair and a walk in Python, seven seconds of the event loop for
    7 MB of small objects, and then the request was served anyway."""
    walks = _Walks(monkeypatch)
    text = b'"x\\u0030 \\u003a \\\\u003a"'
    body = b'{"model": "m", "messages": [{"role": "user", "content": ' + text + b'}], "x": ['
    body += _MANY + b"]}"
    parse_body(body, scan_body(body) if walked else None)
    assert walks.calls == 0


@pytest.mark.parametrize("walked", [True, False])
def test_a_large_body_repeating_a_name_is_refused_without_the_walk(
    monkeypatch: pytest.MonkeyPatch, walked: bool
) -> None:
    walks = _Walks(monkeypatch)
    body = ASK + b', "x": [' + _MANY + b', {"a": 1, "a": 2}]}'
    error = refused(body, walked)
    assert walks.calls == 0
    assert "repeats a name in an object" in error.message and error.param is None


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Calls of `body_names.<name>` (each appends 1)."""
    calls: list[int] = []
    real = getattr(body_names, name)

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(body_names, name, counted)
    return calls


def test_an_empty_array_or_object_is_not_looked_into(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of few strings and many empty arrays: each was looked into a level down (an
    iterator each), 0.7 s of the event loop for 8 MiB of `[]`, three times its parse."""
    looked: list[int] = []

    class Chain:
        def __call__(self, *iterables: Any) -> Any:
            return itertools.chain(*iterables)

        def from_iterable(self, holders: Any) -> Any:
            def counted() -> Any:
                for holder in holders:
                    looked.append(1)
                    yield holder

            return itertools.chain.from_iterable(counted())

    monkeypatch.setattr(body_names, "chain", Chain())
    body = b'{"model": "\xc3\xa9", "input": [' + b",".join([b"[]", b"{}"] * 10_000)
    body += b', [{"a": [1]}]]}'
    scan = scan_body(body)
    assert scan is not None and scan.colons == 3  # walked: few strings, not ASCII
    parse_body(body, scan)
    assert body_names._members(orjson.loads(body)) == 3
    assert len(looked) < 20  # the top object, `input`, the last array, its object, ...
    repeated = body.replace(b'{"a": [1]}', b'{"a": [1], "a": 2}')
    with pytest.raises(GatewayError, match="repeats"):
        parse_body(repeated, scan_body(repeated))


def test_escaped_colons_are_counted_without_the_pattern_unless_a_backslash_may_be_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, any `\\u003` sent the body through a pattern tried at every byte (0.25 s
    for 8 MiB); an escape whose backslash no other precedes is counted in C."""
    calls: list[int] = []
    real = body_names._COLON_ESCAPES

    class Counted:
        def finditer(self, body: bytes) -> Any:
            calls.append(1)
            return real.finditer(body)

    monkeypatch.setattr(body_names, "_COLON_ESCAPES", Counted())
    assert body_names._escaped_colons(b'["\\u003a", "\\u003A:", "\\u0030"]') == 2
    assert calls == []
    assert body_names._escaped_colons(b'["\\\\u003a", "\\\\\\u003A"]') == 1
    assert calls == [1]


def test_the_exact_check_spells_the_path_of_the_object_found_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A path spelled for every member cost 18 ms for 64 KiB of small objects."""
    steps = _counting(monkeypatch, "_step")
    body = ASK + b', "input": [' + b",".join([b'{"a": 1}'] * 2_000)
    body += b', {"x": {"a": 1, "a": 2}}]}'
    error = refused(body)
    assert error.param == "input[2000]" and "inside `input[2000]`" in error.message
    assert len(steps) <= 2
