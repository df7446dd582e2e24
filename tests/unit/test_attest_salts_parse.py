"""`parse_salts` (the sidecar reads `x-owngate-salts` on every request) checks the value
with a length, a dot and `bytes.translate` instead of a regular expression: it accepts
exactly what the expression accepted, with the same salts, and refuses the rest."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.provenance import Salts
from gateway.provenance.formats.attestation import parse_salts, salts_value

# What parse_salts accepted before (the reference)
_REFERENCE = re.compile(rb"([0-9a-f]{64})\.([0-9a-f]{64})\Z")


def _reference(value: bytes | None) -> Salts | None:
    found = _REFERENCE.match(value) if value else None
    if found is None:
        return None
    return Salts(bytes.fromhex(found[1].decode()), bytes.fromhex(found[2].decode()))


_NEAR = st.binary(min_size=32, max_size=32).map(lambda b: b.hex().encode())


@st.composite
def _values(draw: st.DrawFn) -> bytes:
    """Valid values, and valid values with one byte changed, cut or added (upper case,
    whitespace, a newline at the end, a second dot, a byte past ASCII...)."""
    value = draw(_NEAR) + b"." + draw(_NEAR)
    how = draw(st.sampled_from(["as is", "replace", "cut", "add"]))
    if how == "as is":
        return value
    at = draw(st.integers(0, len(value)))
    byte = bytes([draw(st.sampled_from(b"0fgAF. \n\t\x00\xff:"))])
    if how == "replace":
        return value[:at] + byte + value[at + 1 :]
    if how == "cut":
        return value[:at] + value[at + 1 :]
    return value[:at] + byte + value[at:]


@settings(max_examples=400, deadline=None)
@given(st.one_of(_values(), st.binary(max_size=140), st.none()))
def test_parse_salts_accepts_exactly_what_the_expression_accepted(value: bytes | None) -> None:
    assert parse_salts(value) == _reference(value)


def test_a_value_the_gateway_sends_reads_back_as_its_salts() -> None:
    salts = Salts(bytes(range(32)), bytes(range(32, 64)))
    assert parse_salts(salts_value(salts)) == salts
    assert parse_salts(salts_value(salts) + b"\n") is None
    assert parse_salts(salts_value(salts).upper()) is None
