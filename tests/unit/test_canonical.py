"""RFC 8785 (JCS) canonicalization: the examples of the RFC and its Appendix B numbers."""

from __future__ import annotations

import json
import math
import string
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.canonical import (
    canonical_json,
    canonical_json_of_plain,
    format_number,
    is_plain,
    reference_canonical_json,
)

# RFC 8785 Appendix B: IEEE 754 double (hex) -> ECMAScript serialisation.
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
    # from the cyberphone es6 test file's sample lines
    ("4340000000000001", "9007199254740994"),
    ("4340000000000002", "9007199254740996"),
]


def _double(hex_bits: str) -> float:
    value: float = struct.unpack(">d", bytes.fromhex(hex_bits))[0]
    return value


@pytest.mark.parametrize(("hex_bits", "expected"), APPENDIX_B)
def test_appendix_b_numbers(hex_bits: str, expected: str) -> None:
    assert format_number(_double(hex_bits)) == expected
    assert canonical_json(_double(hex_bits)) == expected.encode()


@pytest.mark.parametrize("hex_bits", ["7fffffffffffffff", "7ff0000000000000", "fff0000000000000"])
def test_appendix_b_nan_and_infinity_are_rejected(hex_bits: str) -> None:
    with pytest.raises(ValueError, match="cannot be represented"):
        canonical_json([_double(hex_bits)])


def test_section_3_2_2_example() -> None:
    text = (
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        r'"string": "\u20ac$\u000F\u000aA' + "'" + r'\u0042\u0022\u005c\\\"\/",'
        '"literals": [null, true, false]}'
    )
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_json(json.loads(text)) == expected.encode("utf-8")


def test_section_3_2_3_sorting_by_utf16_code_units() -> None:
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    encoded = canonical_json(value).decode("utf-8")
    order = list(json.loads(encoded))
    assert order == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    # Code-point order would put U+FB33 before U+1F600; UTF-16 puts the surrogate pair first.
    assert sorted(value) != order


def test_string_escapes() -> None:
    value = '\x00\x01\x08\t\n\x0b\x0c\r\x1f "\\/\x7f\u2028\U0001f600'
    assert canonical_json(value) == (
        '"\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \\"\\\\/\x7f\u2028\U0001f600"'
    ).encode("utf-8")


def test_no_whitespace_and_nesting() -> None:
    value = {"b": [1, {"z": None, "a": True}], "a": {}, "c": []}
    assert canonical_json(value) == b'{"a":{},"b":[1,{"a":true,"z":null}],"c":[]}'


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        (1.0, "1"),
        (-0.0, "0"),
        (0.1, "0.1"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (123e-20, "1.23e-18"),
        (2**53, "9007199254740992"),
        (-(2**53), "-9007199254740992"),
        (0, "0"),
        (-17, "-17"),
    ],
)
def test_numbers(number: float, expected: str) -> None:
    assert format_number(number) == expected


@pytest.mark.parametrize("number", [2**53 + 1, -(2**53) - 1, 10**30])
def test_integers_beyond_ijson_range_are_rejected(number: int) -> None:
    with pytest.raises(ValueError, match="I-JSON"):
        canonical_json({"n": number})


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_non_finite_rejected(number: float) -> None:
    with pytest.raises(ValueError, match="cannot be represented"):
        canonical_json({"x": number})


@pytest.mark.parametrize("key", [1, None, b"a", (1, 2)])
def test_non_string_keys_rejected(key: object) -> None:
    with pytest.raises(ValueError, match="not a string"):
        canonical_json({key: 1})


def test_lone_surrogate_rejected() -> None:
    with pytest.raises(ValueError, match="surrogate"):
        canonical_json({"k": "\ud800"})


@pytest.mark.parametrize("value", [b"bytes", {1, 2}, object()])
def test_unsupported_types_rejected(value: object) -> None:
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        canonical_json(value)


def test_tuple_encodes_as_array_and_bool_is_not_a_number() -> None:
    assert canonical_json((1, True, False)) == b"[1,true,false]"
    with pytest.raises(TypeError):
        format_number(True)


def test_round_trip_many_floats() -> None:
    # Bounded deterministic sweep: the canonical text parses back to the same double.
    for step in range(2000):
        number = (step * 7919 + 1) * 10.0 ** ((step % 60) - 30) / 3.0
        for candidate in (number, -number):
            text = format_number(candidate)
            assert float(text) == candidate, text
            assert "e" not in text or abs(candidate) >= 1e21 or abs(candidate) < 1e-6


# The fast path (orjson with sorted keys) must write exactly what the reference encoder does.

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_fast_path_equals_the_reference_encoder(value: object) -> None:
    assert canonical_json(value) == reference_canonical_json(value)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(alphabet=string.ascii_letters), st.text() | st.integers(0, 2**53)))
def test_plain_values_take_the_fast_path_and_match(value: dict[str, object]) -> None:
    assert is_plain(value)
    assert canonical_json_of_plain(value) == reference_canonical_json(value)


def test_fast_path_escapes_every_code_point_as_jcs_does() -> None:
    # Every code point except lone surrogates, in chunks (one string per chunk).
    points = [*range(0xD800), *range(0xE000, 0x110000)]
    for start in range(0, len(points), 4096):
        text = "".join(map(chr, points[start : start + 4096]))
        assert canonical_json_of_plain(text) == reference_canonical_json(text)


def test_what_the_fast_path_cannot_prove_goes_to_the_reference() -> None:
    # Non-ASCII names (UTF-16 vs byte order), floats, big ints, subclasses: not plain.
    for value in ({"\ue000": 1, "\U0001f600": 2}, {"a": 1.5}, {"a": 2**53 + 1}, [True, 1.0]):
        assert not is_plain(value)
    assert canonical_json({"\ue000": 1, "\U0001f600": 2}) == reference_canonical_json(
        {"\ue000": 1, "\U0001f600": 2}
    )
    with pytest.raises(ValueError, match="lone surrogate"):
        canonical_json_of_plain({"a": "\ud800"})
    with pytest.raises(ValueError, match="lone surrogate"):
        canonical_json({"a": "\ud800"})


def test_what_the_fast_encoder_refuses_is_named_for_its_cause() -> None:
    # orjson raises TypeError for each; only one of them is a lone surrogate.
    deep: object = []
    for _ in range(300):  # past orjson's 254 levels
        deep = [deep]
    for encode in (canonical_json, canonical_json_of_plain):
        with pytest.raises(ValueError, match="nested deeper than") as caught:
            encode({"a": deep})
        assert "surrogate" not in str(caught.value)
    with pytest.raises(ValueError, match="outside the 64-bit range") as caught:
        canonical_json_of_plain({"a": 10**30})
    assert "surrogate" not in str(caught.value)
