"""Provenance records, schema v1: builders for the gateway, a strict parser for auditors.

Three record types, each one log entry, RFC 8785 canonical JSON:

* `dispatch`   made durable before the request leaves the gateway;
* `completion` after the response, linked to its dispatch by leaf index and leaf hash;
* `refusal`    a request the policy refused (nothing was sent anywhere).

Records carry salted commitments to bodies, never content. `docs/provenance.md` documents
every field; `parse_record` rejects unknown fields and wrong types, so the schema is closed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from gateway.provenance.errors import RecordError
from gateway.provenance.schema import SCHEMA_VERSION, problem

_loads: Callable[[bytes], Any]
try:  # orjson parses 3-5x faster, which `audit verify` feels; the stdlib parser suffices
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - an auditor's minimal install
    _loads = json.loads

__all__ = [
    "RECORD_TYPES",
    "SCHEMA_VERSION",
    "BackendRef",
    "LogEntry",
    "PolicyRef",
    "Record",
    "RecordType",
    "Retention",
    "TraceStep",
    "Usage",
    "completion_record",
    "dispatch_record",
    "format_time",
    "parse_record",
    "refusal_record",
    "validate_record",
]

RecordType = Literal["dispatch", "completion", "refusal"]
RECORD_TYPES: tuple[RecordType, ...] = ("dispatch", "completion", "refusal")


@dataclass(frozen=True, slots=True)
class LogEntry:
    """Where an appended record landed: its leaf index and RFC 6962 leaf hash."""

    index: int
    leaf_hash: bytes


@dataclass(frozen=True, slots=True)
class PolicyRef:
    id: str
    version: str
    digest: str


@dataclass(frozen=True, slots=True)
class Retention:
    days: int
    zero_data_retention: bool
    training: bool


@dataclass(frozen=True, slots=True)
class BackendRef:
    id: str
    tier: Literal["private", "hosted"]
    kind: str
    provider: str
    owner: str
    region: str
    retention: Retention


@dataclass(frozen=True, slots=True)
class TraceStep:
    """One line of the policy decision trace: a backend admitted or excluded, by which rule."""

    backend: str
    verdict: Literal["admitted", "excluded"]
    rule: str


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC with milliseconds, e.g. 2026-01-31T12:00:00.250Z."""
    if moment.tzinfo is None:
        raise ValueError("record times must be timezone-aware")
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _policy(policy: PolicyRef) -> dict[str, object]:
    return {"id": policy.id, "version": policy.version, "digest": policy.digest}


def _trace(trace: Sequence[TraceStep]) -> list[object]:
    return [{"backend": s.backend, "verdict": s.verdict, "rule": s.rule} for s in trace]


def dispatch_record(
    *,
    request_id: str,
    time: datetime,
    tenant: str,
    model: str,
    policy: PolicyRef,
    trace: Sequence[TraceStep],
    backend: BackendRef,
    fallback_reason: str | None,
    request_commitment: str,
) -> dict[str, object]:
    r = backend.retention
    return {
        "v": SCHEMA_VERSION,
        "type": "dispatch",
        "request_id": request_id,
        "time": format_time(time),
        "tenant": tenant,
        "model": model,
        "policy": _policy(policy),
        "trace": _trace(trace),
        "backend": {
            "id": backend.id,
            "tier": backend.tier,
            "kind": backend.kind,
            "provider": backend.provider,
            "owner": backend.owner,
            "region": backend.region,
            "retention": {
                "days": r.days,
                "zero_data_retention": r.zero_data_retention,
                "training": r.training,
            },
        },
        "fallback": fallback_reason,
        "request_commitment": request_commitment,
    }


def completion_record(
    *,
    request_id: str,
    time: datetime,
    dispatch: LogEntry,
    status: int,
    error: str | None,
    usage: Usage | None,
    latency_ms: int,
    response_commitment: str | None,
) -> dict[str, object]:
    return {
        "v": SCHEMA_VERSION,
        "type": "completion",
        "request_id": request_id,
        "time": format_time(time),
        "dispatch": {"index": dispatch.index, "hash": dispatch.leaf_hash.hex()},
        "status": status,
        "error": error,
        "usage": None
        if usage is None
        else {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        },
        "latency_ms": latency_ms,
        "response_commitment": response_commitment,
    }


def refusal_record(
    *,
    request_id: str,
    time: datetime,
    tenant: str,
    model: str,
    policy: PolicyRef,
    trace: Sequence[TraceStep],
    rule: str,
    reason: str,
    request_commitment: str | None,
) -> dict[str, object]:
    return {
        "v": SCHEMA_VERSION,
        "type": "refusal",
        "request_id": request_id,
        "time": format_time(time),
        "tenant": tenant,
        "model": model,
        "policy": _policy(policy),
        "trace": _trace(trace),
        "rule": rule,
        "reason": reason,
        "request_commitment": request_commitment,
    }


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
    """Parse one log entry (canonical JSON bytes) into a schema-checked record."""
    try:
        value = _loads(entry)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"entry is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise RecordError("entry is JSON but not an object")
    return validate_record(value)
