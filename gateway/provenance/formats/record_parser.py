"""The auditor's side of schema v1: `parse_record` reads one log entry into a `Record`,
strictly (the schema is closed, and an entry must be its record's own RFC 8785 encoding),
and `validate_record` checks a record object. The builders are in records.py, which
re-exports these."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.canonical import canonical_json_of_plain
from gateway.provenance.errors import RecordError
from gateway.provenance.formats.schema import problem

_loads: Callable[[bytes], Any]
try:  # orjson parses 3-5x faster, which `audit verify` feels; the stdlib parser suffices
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - an auditor's minimal install
    _loads = json.loads

__all__ = ["RECORD_TYPES", "Record", "RecordType", "parse_record", "validate_record"]

RecordType = Literal["dispatch", "completion", "refusal", "admin", "attestation"]
RECORD_TYPES: tuple[RecordType, ...] = ("dispatch", "completion", "refusal", "admin", "attestation")


@dataclass(frozen=True, slots=True)
class Record:
    """A parsed, schema-checked record; `data` is the whole JSON object."""

    type: RecordType
    request_id: str
    time: str
    data: dict[str, Any]


def validate_record(value: Mapping[str, object]) -> Record:
    """Check a record against schema v1; raises RecordError naming the first problem."""
    if not isinstance(value, Mapping):
        raise RecordError("a record must be a JSON object")
    found = problem(value)
    if found is not None:
        raise RecordError(found)
    data: dict[str, Any] = value if isinstance(value, dict) else dict(value)
    return Record(data["type"], data["request_id"], data["time"], data)


def parse_record(entry: bytes) -> Record:
    """Parse one log entry (canonical JSON bytes) into a schema-checked record.

    The entry must be its record's own RFC 8785 encoding, byte for byte, as the writer
    makes it: JSON parsers differ on a member written twice (this one keeps the last,
    others the first or refuse), so an entry that is not canonical could say one thing to
    owngate's audit and another to an independent verifier."""
    try:
        value = _loads(entry)
    # ValueError: also the stdlib's number over 4,300 digits; RecursionError: its nesting
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        raise RecordError(f"entry is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(value, dict):
        raise RecordError("entry is JSON but not an object")
    record = validate_record(value)
    try:
        canonical = canonical_json_of_plain(value)
    except ValueError as exc:
        raise RecordError(f"entry cannot be encoded as RFC 8785 JSON: {exc}") from exc
    if canonical != entry:
        raise RecordError(
            "entry is not its record's RFC 8785 canonical encoding (a member written "
            "twice, whitespace, member order or escapes differ): parsers could read it "
            "differently"
        )
    return record
