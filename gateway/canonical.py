"""RFC 8785 JSON Canonicalization Scheme (JCS): the one encoder for signed or hashed bytes.

`canonical_json(value)` turns plain Python data (dict, list/tuple, str, int, float, bool,
None) into the unique JCS byte string:

* object members sorted by the UTF-16 code units of their names, no whitespace;
* strings escaped minimally (`\\"`, `\\\\`, `\\b \\f \\n \\r \\t`, other C0 controls as
  `\\u00xx`), everything else as literal UTF-8; lone surrogates are rejected;
* numbers as ECMAScript `Number.prototype.toString` prints an IEEE 754 double
  (RFC 8785 section 3.2.2.3). Integers are accepted while they are exact doubles
  (|n| <= 2**53); larger ones raise, as I-JSON (RFC 7493) cannot carry them.

NaN, infinities, non-str keys and integers beyond 2**53 raise ValueError; unsupported types
raise TypeError. The output is valid UTF-8 and parses back to an equal value.

Fast path: when orjson is installed and the value holds no floats, only ASCII member names
and integers within range, orjson with sorted keys writes exactly the JCS bytes (its string
escaping is JCS's for every code point, and for ASCII names byte order is UTF-16 order;
tests/unit/test_canonical.py checks both encoders agree), some 30x faster. Anything else takes
the pure-Python encoder, which is the reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring
from math import isfinite

_fast_dumps: Callable[[object], bytes] | None
try:
    import orjson

    # `orjson.dumps(value, option=OPT_SORT_KEYS)` with no Python frame of its own (every
    # record, receipt and statement the log writes goes through it)
    _fast_dumps = functools.partial(orjson.dumps, option=orjson.OPT_SORT_KEYS)

except ImportError:  # pragma: no cover - an auditor's minimal install
    _fast_dumps = None

__all__ = [
    "MAX_SAFE_INTEGER",
    "canonical_json",
    "canonical_json_of_plain",
    "canonical_part",
    "format_number",
    "is_plain",
    "reference_canonical_json",
]

#: The largest integer magnitude JCS accepts: every int up to 2**53 is an exact double.
MAX_SAFE_INTEGER = 2**53


def canonical_json(value: object) -> bytes:
    """Return the RFC 8785 canonical UTF-8 encoding of `value`."""
    if _fast_dumps is not None and is_plain(value):
        try:
            return _fast_dumps(value)
        except TypeError as exc:  # what is_plain leaves to orjson: lone surrogates, depth
            raise _refused(exc) from exc
    return reference_canonical_json(value)


def canonical_json_of_plain(value: object) -> bytes:
    """`canonical_json` for a value the caller knows is plain (`is_plain`), e.g. a
    provenance record that passed its schema check: skips the walk that proves it."""
    if _fast_dumps is None:  # pragma: no cover - an auditor's minimal install
        return reference_canonical_json(value)
    try:
        return _fast_dumps(value)
    except TypeError as exc:
        raise _refused(exc) from exc


def canonical_part(value: object) -> object:
    """`value` (plain, as `canonical_json_of_plain` takes it) encoded once, to be placed as
    it is inside values later given to `canonical_json_of_plain`: the same bytes as
    encoding it in place each time (JCS of a member is the member's own JCS), without
    doing so (an `orjson.Fragment`). Without orjson, `value` itself."""
    if _fast_dumps is None:  # pragma: no cover - an auditor's minimal install
        return value
    return orjson.Fragment(canonical_json_of_plain(value))


def _refused(exc: TypeError) -> ValueError:
    """orjson's TypeError, named for its cause: it raises one type for all of them."""
    reason = str(exc)
    if "surrogate" in reason:
        return ValueError("string contains a lone surrogate, which JCS cannot encode")
    if "Recursion limit" in reason:
        return ValueError("value is nested deeper than the encoder's limit of 254 levels")
    if "64-bit" in reason:
        return ValueError(
            f"integer is outside the 64-bit range (JCS takes integers within +-2**53): {reason}"
        )
    return ValueError(f"value cannot be encoded as JCS: {reason}")


def reference_canonical_json(value: object) -> bytes:
    """The pure-Python JCS encoder (what the fast path must equal)."""
    parts: list[str] = []
    _encode(value, parts)
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("string contains a lone surrogate, which JCS cannot encode") from exc


def format_number(value: float | int) -> str:
    """Serialise a number as ECMAScript's `Number.prototype.toString` would (JCS 3.2.2.3)."""
    if isinstance(value, bool):
        raise TypeError("bool is not a number")
    if isinstance(value, int):
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return str(value)
        raise ValueError(f"integer {value} is outside the I-JSON range of +-2**53")
    if not isfinite(value):
        raise ValueError(f"{value!r} cannot be represented in JSON")
    if value == 0.0:
        return "0"  # also -0.0
    sign = "-" if value < 0 else ""
    digits, point = _shortest_digits(abs(value))
    return sign + _es_layout(digits, point)


def _shortest_digits(value: float) -> tuple[str, int]:
    """Shortest round-trip decimal digits of a positive finite float and the exponent `n`
    such that value == 0.DIGITS * 10**n (ECMAScript's k digits and n)."""
    text = repr(value)  # Python's repr is the shortest round-tripping form (David Gay)
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    leading_zeros = len(whole + fraction) - len((whole + fraction).lstrip("0"))
    point = len(whole) - leading_zeros + (int(exponent) if exponent else 0)
    digits = digits.rstrip("0") or "0"
    return digits, point


def _es_layout(digits: str, n: int) -> str:
    """Lay out digits (k of them) with decimal exponent n per ECMA-262 Number::toString."""
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    exponent = n - 1
    exp_text = f"e+{exponent}" if exponent >= 0 else f"e{exponent}"
    if k == 1:
        return digits + exp_text
    return digits[0] + "." + digits[1:] + exp_text


def is_plain(value: object) -> bool:
    """True when orjson's sorted output is the JCS output: only dicts with ASCII names,
    lists, strings, bools, None and integers within +-2**53 (exact types: no subclasses)."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return True
    if kind is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER  # type: ignore[operator]
    if kind is dict:
        for name, item in value.items():  # type: ignore[attr-defined]
            if type(name) is not str or not name.isascii() or not is_plain(item):
                return False
        return True
    if kind is list or kind is tuple:
        return all(is_plain(item) for item in value)  # type: ignore[attr-defined]
    return False


def _utf16_key(name: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly as the sequence of UTF-16 code units.
    return name.encode("utf-16-be", "surrogatepass")


def _encode(value: object, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(encode_basestring(value))
    elif isinstance(value, int | float):
        out.append(format_number(value))
    elif isinstance(value, Mapping):
        _encode_object(value, out)
    elif isinstance(value, list | tuple):
        out.append("[")
        for position, item in enumerate(value):
            if position:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON-serialisable for JCS")


def _encode_object(value: Mapping[object, object], out: list[str]) -> None:
    names: list[str] = []
    for name in value:
        if not isinstance(name, str):
            raise ValueError(f"object member name {name!r} is not a string")
        names.append(name)
    names.sort(key=_utf16_key)
    out.append("{")
    for position, name in enumerate(names):
        if position:
            out.append(",")
        out.append(encode_basestring(name))
        out.append(":")
        _encode(value[name], out)
    out.append("}")
