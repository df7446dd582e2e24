"""Integer literals outside the 64-bit range in a request body, refused
(`check_integers`, called by gateway/api/body.py `parse_body`).

orjson reads an integer literal below -2**63 or from 2**64 on as a float. A body the
gateway re-encodes (an escaped `model` alias, `stream_options.include_usage` it asks a
stream for, a `cache_salt` for a backend that isolates its prefix cache, every hosted
request, which LiteLLM encodes from the parsed document) would then hand the backend
another number than the client sent (`18446744073709551616` becomes
`1.8446744073709552e19`): such a body is refused, 400, before anything is dispatched.

Cheap on the usual body: no such integer can be written with fewer than 19 digits in a
row, which two C passes find (or, for a body whose strings `scan_body` walked, the same
search over the bytes outside its strings only); only a body that has such a run is
parsed again, with the standard library, whose `parse_int` sees each literal as written.
"""

from __future__ import annotations

import json
from typing import Final

from gateway.errors import ErrorCode, GatewayError
from gateway.json_loads import at_most, no_collection

__all__ = ["check_integers", "long_digit_run"]

# A digit as `0`, any other byte as `.`: a run of `_LONG` zeros in the translation is a
# run of digits long enough to be an integer outside the 64-bit range (2**64 has 20
# digits, -2**63 - 1 has 19), found by two C passes (a translate and a `find`).
_DIGITS_AS_ZERO: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x2E for b in range(256))
_LONG: Final = b"0" * 19
_INT_MIN: Final = -(2**63)
_UINT_END: Final = 2**64


class _OutOfRange(Exception):
    """An integer literal the 64-bit integers do not hold (`check_integers`)."""


def _in_range(literal: str) -> int:
    """`json`'s `parse_int`: the literal's value, or `_OutOfRange` (checked on its length
    first: `int` refuses literals of thousands of digits with a ValueError)."""
    if len(literal) > 21:
        raise _OutOfRange(literal)
    value = int(literal)
    if not _INT_MIN <= value < _UINT_END:
        raise _OutOfRange(literal)
    return value


def long_digit_run(body: bytes, start: int = 0, end: int | None = None) -> bool:
    """Whether `body[start:end]` holds 19 digits in a row (no integer outside the 64-bit
    range can be written with fewer)."""
    part = body if start == 0 and end is None else body[start:end]
    return part.translate(_DIGITS_AS_ZERO).find(_LONG) >= 0


def check_integers(body: bytes, digits: bool | None) -> None:
    """Refuse an integer literal outside the 64-bit range anywhere in `body` (a valid JSON
    text of at most `MAX_DEPTH` levels). Only a body with 19 digits in a row (outside its
    strings, where the scan walked them: `digits`, `BodyScan.digits`; None: not walked) is
    parsed again, with the standard library, whose `parse_int` sees each integer literal
    as it is written."""
    if not (long_digit_run(body) if digits is None else digits):
        return
    try:
        with no_collection(at_most(body)):
            json.loads(body, parse_int=_in_range)
    except _OutOfRange:
        raise GatewayError(
            ErrorCode.invalid_request,
            "the request body holds an integer outside the 64-bit range (below -2**63 or "
            "from 2**64 on), which a backend would read as another number",
        ) from None
    except ValueError:
        return  # what the standard library reads otherwise holds no such integer orjson took
