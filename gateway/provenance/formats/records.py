"""Provenance records, schema v1: builders for the gateway, a strict parser for auditors.

Four record types, each one log entry, RFC 8785 canonical JSON:

* `dispatch`   made durable before the request leaves the gateway;
* `completion` after the response, linked to its dispatch by leaf index and leaf hash;
* `refusal`    a request the policy refused (nothing was sent anywhere);
* `admin`      an admin API action.

Records carry salted commitments to bodies, never content (docs/provenance.md); `parse_record`
(record_parser.py, re-exported here) rejects unknown fields and wrong types: a closed schema.
The builders take the values of record_types.py (re-exported here), check their input
(record_checks.py) and raise RecordError for anything the
schema would refuse, so what they return is valid by construction: appended with
`checked=True`, unwalked (tests/unit/test_provenance_units.py holds the two to agreement).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime

from gateway.provenance.errors import RecordError
from gateway.provenance.formats.attestation import Attestation
from gateway.provenance.formats.record_checks import (
    SPKI_PIN,
    basis_field,
    check_count,
    check_flag,
    check_hex64,
    check_one_of,
    check_status,
    check_text,
)
from gateway.provenance.formats.record_parser import (
    RECORD_TYPES,
    Record,
    RecordType,
    parse_record,
    validate_record,
)
from gateway.provenance.formats.record_types import (
    BackendRef,
    DataClass,
    LogEntry,
    PolicyRef,
    Retention,
    TraceStep,
    Usage,
)
from gateway.provenance.formats.schema import (
    ADMIN_OUTCOMES,
    SCHEMA_VERSION,
    STREAM_ERRORS,
    usage_bound_problem,
)
from gateway.provenance.formats.upstream_ids import UpstreamIds

__all__ = [
    "RECORD_TYPES",
    "SCHEMA_VERSION",
    "BackendRef",
    "DataClass",
    "LogEntry",
    "PolicyRef",
    "Record",
    "RecordType",
    "Retention",
    "TraceStep",
    "Usage",
    "admin_record",
    "completion_record",
    "dispatch_record",
    "format_time",
    "parse_record",
    "refusal_record",
    "validate_record",
]


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC with milliseconds, e.g. 2026-01-31T12:00:00.250Z (`isoformat`'s
    digits; its date and time of day made once per second, a third of its cost)."""
    if moment.tzinfo is None:
        raise ValueError("record times must be timezone-aware")
    u = moment if moment.tzinfo is UTC else moment.astimezone(UTC)
    return (
        _second(u.year, u.month, u.day, u.hour, u.minute, u.second) + _MILLIS[u.microsecond // 1000]
    )


_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))


@functools.lru_cache(maxsize=4)  # a memo of a pure function: records of one second share it
def _second(year: int, month: int, day: int, hour: int, minute: int, second: int) -> str:
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"


def _policy(policy: PolicyRef) -> dict[str, object]:
    if type(policy) is not PolicyRef:
        raise RecordError("policy must be a PolicyRef")
    return {"id": policy.id, "version": policy.version, "digest": policy.digest}


def _data_class(data_class: DataClass | None) -> str | None:
    if data_class is not None and type(data_class) is not DataClass:
        raise RecordError("data_class must be a DataClass or None")
    return None if data_class is None else data_class.name


def _trace(trace: Sequence[TraceStep]) -> list[object]:
    steps: list[object] = []
    for s in trace:
        if type(s) is not TraceStep:
            raise RecordError("trace steps must be TraceStep")
        steps.append({"backend": s.backend, "verdict": s.verdict, "rule": s.rule})
    return steps


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
    peer_spki: str | None = None,
    attested: bool = False,
    fallback_basis: Sequence[tuple[str, str]] | None = None,
    provider_model: str | None = None,
    blind: str | None = None,
    data_class: DataClass | None = None,
) -> dict[str, object]:
    """`peer_spki`: the key the backend presented on the connection that carried the
    request (`sha256//` + base64), `attested`: its certificate stated the backend's facts;
    `fallback_basis` (with `fallback_reason`): each eligible private backend's state that
    allowed the fallback; `provider_model`: the model string a hosted attempt sends its
    provider; `blind`: random bytes no receipt gives (schema.py); `data_class`: the class
    the decision applied (its `name` None: written as null). Absent when None."""
    check_text(request_id, "request_id", empty=False)
    check_text(tenant, "tenant")
    check_text(model, "model")
    if type(backend) is not BackendRef:
        raise RecordError("backend must be a BackendRef")
    if fallback_reason is not None:
        check_text(fallback_reason, "fallback")
    basis = None if fallback_basis is None else basis_field(fallback_basis, fallback_reason)
    check_hex64(request_commitment, "request_commitment")
    if peer_spki is not None and not SPKI_PIN.match(peer_spki):
        raise RecordError(f"peer_spki must be sha256// and 44 base64 digits, not {peer_spki!r}")
    check_flag(attested, "attested")
    if provider_model is not None:
        check_text(provider_model, "provider_model", empty=False)
    check_hex64(blind, "blind", optional=True)
    applied = _data_class(data_class)
    r = backend.retention
    ref: dict[str, object] = {
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
    }
    if peer_spki is not None:
        ref["peer"] = {"spki_sha256": peer_spki, "attested": attested}
    record: dict[str, object] = {
        "v": SCHEMA_VERSION,
        "type": "dispatch",
        "request_id": request_id,
        "time": format_time(time),
        "tenant": tenant,
        "model": model,
        "policy": _policy(policy),
        "trace": _trace(trace),
        "backend": ref,
        "fallback": fallback_reason,
        "request_commitment": request_commitment,
    }
    optional = {"fallback_basis": basis, "provider_model": provider_model, "blind": blind}
    record.update((name, value) for name, value in optional.items() if value is not None)
    if data_class is not None:
        record["data_class"] = applied
    return record


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
    attestation: Attestation | None = None,
    upstream: UpstreamIds | None = None,
    usage_bound: int | None = None,
    stream_error: str | None = None,
    blind: str | None = None,
) -> dict[str, object]:
    """`attestation`: an attested backend's countersignature (or why none was accepted);
    `upstream`: a hosted provider's ids for the answer; `usage_bound`: the tokens the
    tenant was charged instead of `usage`, which exceeded what the request justified;
    `stream_error`: "backend" when the backend's own error event reached the client of a
    stream; `blind`: random bytes no receipt gives (schema.py). Absent when None."""
    check_text(request_id, "request_id", empty=False)
    if type(dispatch) is not LogEntry or len(dispatch.leaf_hash) != 32:
        raise RecordError("dispatch must be the LogEntry of the dispatch record")
    check_count(dispatch.index, "dispatch index")
    check_status(status)
    if error is not None:
        check_text(error, "error")
    if usage is not None and type(usage) is not Usage:
        raise RecordError("usage must be a Usage or None")
    check_count(latency_ms, "latency_ms")
    check_hex64(response_commitment, "response_commitment", optional=True)
    if attestation is not None and type(attestation) is not Attestation:
        raise RecordError("attestation must be an Attestation or None")
    if upstream is not None and type(upstream) is not UpstreamIds:
        raise RecordError("upstream must be UpstreamIds or None")
    if usage_bound is not None:
        if usage is None:
            raise RecordError("usage_bound bounds a reported usage: usage must be given")
        check_count(usage_bound, "usage_bound")
        counts = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        }
        found = usage_bound_problem({**counts, "total_tokens": usage.total_tokens}, usage_bound)
        if found is not None:
            raise RecordError(found)
    if stream_error is not None:
        check_one_of(stream_error, "stream_error", STREAM_ERRORS)
    check_hex64(blind, "blind", optional=True)
    record: dict[str, object] = {
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
    if attestation is not None:
        record["attestation"] = attestation.field()
    if upstream is not None:
        record["upstream"] = upstream.field()
    if usage_bound is not None:
        record["usage_bound"] = usage_bound
    if stream_error is not None:
        record["stream_error"] = stream_error
    if blind is not None:  # what no receipt gives (schema.py)
        record["blind"] = blind
    return record


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
    blind: str | None = None,
    data_class: DataClass | None = None,
) -> dict[str, object]:
    """`data_class`: as a dispatch record's (None: absent)."""
    check_text(request_id, "request_id", empty=False)
    check_text(tenant, "tenant")
    check_text(model, "model")
    check_text(rule, "rule")
    check_text(reason, "reason")
    check_hex64(request_commitment, "request_commitment", optional=True)
    check_hex64(blind, "blind", optional=True)
    applied = _data_class(data_class)
    record: dict[str, object] = {
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
    if blind is not None:  # what no receipt gives (schema.py)
        record["blind"] = blind
    if data_class is not None:
        record["data_class"] = applied
    return record


def admin_record(
    *,
    request_id: str,
    time: datetime,
    role: str,
    token: str,
    action: str,
    subject: str,
    change_digest: str,
    outcome: str,
    blind: str | None = None,
) -> dict[str, object]:
    """An admin API action (reload, drain, key create/revoke): who took it (`role`, and
    `token`, the first 12 hex digits of the admin token's digest, or "loopback"), what
    (`action` on `subject`), the change's SHA-256, whether it was taken (`outcome`);
    `blind`: random bytes no receipt gives (schema.py). Absent when None."""
    check_text(request_id, "request_id", empty=False)
    check_text(subject, "subject")
    check_hex64(change_digest, "change_digest")
    check_one_of(outcome, "outcome", ADMIN_OUTCOMES)
    check_hex64(blind, "blind", optional=True)
    record: dict[str, object] = {
        "v": SCHEMA_VERSION,
        "type": "admin",
        "request_id": request_id,
        "time": format_time(time),
        "role": role,
        "token": token,
        "action": action,
        "subject": subject,
        "change_digest": change_digest,
        "outcome": outcome,
    }
    if blind is not None:  # what no receipt gives (schema.py)
        record["blind"] = blind
    return record
