"""The checks the record builders (records.py) make of the values they are given: each
raises RecordError naming the field and what it must be."""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.canonical import MAX_SAFE_INTEGER
from gateway.provenance.errors import RecordError
from gateway.provenance.formats.receipt_payload import REQUEST_ID
from gateway.provenance.formats.schema import BASIS_STATES, STATUSES

__all__ = [
    "SPKI_PIN",
    "basis_field",
    "check_count",
    "check_flag",
    "check_hex64",
    "check_one_of",
    "check_status",
    "check_text",
]


def check_text(value: object, what: str, *, empty: bool = True) -> None:
    if type(value) is not str or not (empty or value):
        raise RecordError(f"{what} must be a{'' if empty else ' non-empty'} string, not {value!r}")
    if what == "request_id" and not REQUEST_ID.match(value):  # the id receipts carry
        raise RecordError(f"request_id must be 1-128 of A-Za-z0-9._:-, not {value!r:.80}")


def check_count(value: object, what: str) -> None:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise RecordError(f"{what} must be an integer 0..2**53, not {value!r}")


def check_one_of(value: object, what: str, allowed: frozenset[str]) -> None:
    if value not in allowed:
        raise RecordError(f"{what} must be one of {sorted(allowed)}, not {value!r:.80}")


def check_flag(value: object, what: str) -> None:
    if type(value) is not bool:
        raise RecordError(f"{what} must be a bool, not {value!r}")


SPKI_PIN = re.compile(r"sha256//[A-Za-z0-9+/]{43}=\Z")  # a key pin, as curl writes it


def check_hex64(value: object, what: str, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if type(value) is not str or len(value) != 64 or value.strip("0123456789abcdef"):
        raise RecordError(f"{what} must be 64 lowercase hex digits, not {value!r}")


def check_status(status: object) -> None:
    """A completion's status: a final HTTP status, 200..599 (the gateway relays and writes
    no other, so a record holding another was not written by it)."""
    if type(status) is not int or status not in STATUSES:
        raise RecordError(f"status must be an HTTP status 200..599, not {status!r}")


def basis_field(basis: Sequence[tuple[str, str]], reason: str | None) -> list[object]:
    """A dispatch record's `fallback_basis`: each eligible private backend's state."""
    if reason is None:
        raise RecordError("fallback_basis needs a fallback reason")
    states: list[object] = []
    for backend, state in basis:
        check_text(backend, "fallback_basis backend", empty=False)
        check_one_of(state, "fallback_basis state", BASIS_STATES)
        states.append({"backend": backend, "state": state})
    return states
