"""The closed schema of provenance records, version 1, as data, and its checker.

A field's spec is one of: `str` (a string), `int` (an integer 0..2**53, not a bool),
`bool`, a compiled regex (a string it matches), a frozenset (one of these values),
`Optional(spec)`, `ListOf(spec)`, or a dict of field specs (an object with exactly those
fields, except that a field whose spec is `Omittable(spec)` may be absent: fields added
after v1 shipped, so records written before them stay valid). `problem(record)` returns
None for a valid record, else what is wrong first.
docs/provenance.md documents each field.

Each schema is also compiled once into nested predicates, so the common case (a valid
record, checked on the gateway's request path and by `audit verify` for every entry) costs
a few microseconds; only an invalid record walks the spec again to say what is wrong.
A valid record holds only str-keyed dicts with ASCII names, lists, strings, bools, None and
integers 0..2**53: exactly what `gateway.canonical` encodes on its fast path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.canonical import MAX_SAFE_INTEGER
from gateway.provenance.formats.attestation import FAILURES
from gateway.provenance.formats.receipt_payload import REQUEST_ID

__all__ = [
    "ADMIN_OUTCOMES",
    "BASIS_STATES",
    "DATA_CLASS_NAME",
    "RECORD_SCHEMAS",
    "SCHEMA_VERSION",
    "STATUSES",
    "STREAM_ERRORS",
    "ListOf",
    "Omittable",
    "Optional",
    "fields_problem",
    "problem",
    "usage_bound_problem",
]

SCHEMA_VERSION = 1
# A fallback dispatch's `fallback_basis`: what each eligible private backend came to
# (down before any attempt, tried and failed, tried and busy, up but saturated).
BASIS_STATES = frozenset({"down", "failed", "busy", "saturated"})
STREAM_ERRORS = frozenset({"backend"})
# An admin record's `outcome`: the action was taken, or refused with nothing changed
# (a reload the new config failed, a key the config could not take), or taken on this
# replica alone for now ("local": a key revoked while the shared state, Redis, was
# away, queued for it). Absent in records written before it existed, which recorded a
# failed attempt in the same shape as a taken one.
ADMIN_OUTCOMES = frozenset({"done", "failed", "local"})
# A completion's `status`: the final HTTP status the client got, which the gateway only
# ever relays or writes in 200-599 (gateway/upstream/connection.py fails any other). The
# audit needs a countersignature on an answer below 400 alone, so a status out of range
# (999, 2**53) let a forged record of an answer pass as an error needing none.
STATUSES = frozenset(range(200, 600))


@dataclass(frozen=True, slots=True)
class Optional:
    spec: object


@dataclass(frozen=True, slots=True)
class ListOf:
    spec: object


@dataclass(frozen=True, slots=True)
class Omittable:
    """A field that may be absent from its object (present, it must match `spec`)."""

    spec: object


_NONEMPTY = re.compile(r"(?s).")
# ASCII digits: `\d` in a str pattern is any Unicode digit (`٢٠٢٦`), which RFC 3339
# readers refuse
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_SPKI = re.compile(r"sha256//[A-Za-z0-9+/]{43}=\Z")  # as curl --pinnedpubkey writes a pin
_BASE64 = re.compile(r"[A-Za-z0-9+/]{86}==\Z")  # an Ed25519 signature
_UPSTREAM_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}\Z")
_UPSTREAM_MODEL = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}\Z")  # formats/upstream_ids.py
_IDS = ListOf({"header": str, "value": _UPSTREAM_ID})
# A policy's data-class name (gateway/policy/schema.py `DataClassName`): never a label's text.
DATA_CLASS_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}\Z")
_POLICY = {"id": str, "version": str, "digest": str}
_TRACE = ListOf({"backend": str, "verdict": frozenset({"admitted", "excluded"}), "rule": str})
_COMMON: dict[str, object] = {
    "v": frozenset({SCHEMA_VERSION}),
    "type": frozenset({"dispatch", "completion", "refusal", "admin", "attestation"}),
    "request_id": REQUEST_ID,
    "time": _TIME,
}
RECORD_SCHEMAS: dict[str, dict[str, object]] = {
    "dispatch": {
        **_COMMON,
        "tenant": str,
        "model": str,
        "policy": _POLICY,
        "trace": _TRACE,
        "backend": {
            "id": _NONEMPTY,
            "tier": frozenset({"private", "hosted"}),
            "kind": str,
            "provider": str,
            "owner": str,
            "region": str,
            "retention": {"days": int, "zero_data_retention": bool, "training": bool},
            # The TLS peer of the connection that carried the request (a private https
            # backend): its key, and whether its certificate attested the facts above.
            "peer": Omittable({"spki_sha256": _SPKI, "attested": bool}),
        },
        "fallback": Optional(str),
        # With a fallback: each eligible private backend's state that allowed it.
        "fallback_basis": Omittable(ListOf({"backend": _NONEMPTY, "state": BASIS_STATES})),
        "request_commitment": _HEX64,
        # A hosted attempt: the model string sent to the provider (LiteLLM's, as
        # gateway.yaml's `provider_model`); absent for private backends and older records.
        "provider_model": Omittable(_NONEMPTY),
        # 32 random bytes, in no receipt: the trace names every backend serving the model
        # (those the policy excluded, with their rule) and `fallback_basis` the private
        # ones' states, which no answer tells the tenant, and the rest of the record is
        # its own or guessable, so the receipt's leaf hash confirmed a guess of them;
        # absent in records written before it existed.
        "blind": Omittable(_HEX64),
        # The data class the decision applied: one of the policy's class names (the label's
        # class, or the policy's default for an unlabelled request), null for none; never
        # the label's text. Absent in records written before it existed.
        "data_class": Omittable(Optional(DATA_CLASS_NAME)),
    },
    "completion": {
        **_COMMON,
        "dispatch": {"index": int, "hash": _HEX64},
        "status": STATUSES,
        "error": Optional(str),
        "usage": Optional({"prompt_tokens": int, "completion_tokens": int, "total_tokens": int}),
        "latency_ms": int,
        "response_commitment": Optional(_HEX64),
        # A private backend marked `attest`: its sidecar's countersignature, or why none
        # was accepted (formats/attestation.py).
        "attestation": Omittable(
            {
                "key": _NONEMPTY,
                "counter": Optional(int),
                "time": Optional(_TIME),
                "sig": Optional(_BASE64),
                "failure": Optional(FAILURES),
            }
        ),
        # A hosted provider's own ids for the answer (formats/upstream_ids.py).
        # `model`: the model the provider's answer names; absent in older records.
        "upstream": Omittable(
            {
                "response_id": Optional(_UPSTREAM_ID),
                "request_ids": _IDS,
                "model": Omittable(Optional(_UPSTREAM_MODEL)),
            }
        ),
        # The tokens charged instead of `usage`, which exceeded what the request justified
        # (gateway/api/usage_bound.py); absent when the usage was within it, or none.
        "usage_bound": Omittable(int),
        # A stream whose backend's own error event reached the client (its SDK raised
        # it): "backend"; absent otherwise, and in records written before it existed.
        "stream_error": Omittable(STREAM_ERRORS),
        # 32 random bytes, in no receipt: the rest of a completion is the tenant's own or
        # guessable (its dispatch's index and hash, the status and usage it got, the
        # commitment its salts open, a time and a latency to the millisecond), so a level-0
        # neighbour hash in its inclusion proof confirmed a guess of it (the latency and
        # status of an attempt it never saw); absent in records written before it existed.
        "blind": Omittable(_HEX64),
    },
    "refusal": {
        **_COMMON,
        "tenant": str,
        "model": str,
        "policy": _POLICY,
        "trace": _TRACE,
        "rule": str,
        "reason": str,
        "request_commitment": Optional(_HEX64),
        # 32 random bytes, in no receipt: the receipt's leaf hash let the tenant confirm
        # a guess of the record, telling a model no backend serves from a hidden one
        # (gateway/api/listing.py) and, from its trace, which backends the decision judged;
        # absent in records written before every refusal held it (only 404s did, or none).
        "blind": Omittable(_HEX64),
        # As a dispatch's: null also when the label named no class of the policy's.
        "data_class": Omittable(Optional(DATA_CLASS_NAME)),
    },
    # An action taken through the admin API (gateway/admin/): who (the role and the first
    # 12 hex digits of the admin token's digest), what, and the digest of the change.
    "admin": {
        **_COMMON,
        "role": frozenset({"operator", "security", "auditor", "admin"}),
        "token": re.compile(r"[0-9a-f]{12}\Z|loopback\Z"),
        "action": frozenset({"reload", "drain", "key_create", "key_revoke"}),
        "subject": str,
        "change_digest": _HEX64,
        "outcome": Omittable(ADMIN_OUTCOMES),
        # 32 random bytes, in no receipt: an admin record can be the level-0 neighbour of
        # a tenant's entry in the inclusion proof it fetches, and the rest of it is
        # guessable (the action and subject: its own key revoked, a reload; the change
        # digest of what it can name; a time to the millisecond; the token's 48-bit digest
        # prefix) but for the request id, an id, not a secret; absent in records written
        # before it existed.
        "blind": Omittable(_HEX64),
    },
    # The `owngate attest` sidecar's log entry: the statement it countersigned.
    "attestation": {
        **_COMMON,
        "counter": int,
        "key": _NONEMPTY,
        "request_commitment": _HEX64,
        "response_commitment": _HEX64,
    },
}


def _valid(value: object, spec: object) -> bool:
    if spec is str:
        return type(value) is str
    if spec is int:
        return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER
    if spec is bool:
        return type(value) is bool
    kind = type(spec)
    if kind is dict:
        return type(value) is dict and fields_problem(value, spec) is None  # type: ignore[arg-type]
    if kind is frozenset:
        return type(value) in (str, int) and value in spec  # type: ignore[operator]
    if isinstance(spec, re.Pattern):
        return type(value) is str and spec.match(value) is not None
    if isinstance(spec, Optional):
        return value is None or _valid(value, spec.spec)
    if isinstance(spec, ListOf):
        return type(value) is list and all(_valid(item, spec.spec) for item in value)
    raise TypeError(f"unknown schema spec {spec!r}")


def fields_problem(value: Mapping[str, object], fields: Mapping[str, object]) -> str | None:
    """What is wrong with `value` against one record type's `fields` (None: nothing)."""
    if value.keys() != fields.keys():
        unknown = sorted(value.keys() - fields.keys())
        if unknown:
            return f"unknown field {unknown[0]!r}"
        missing = sorted(n for n in fields.keys() - value.keys() if not _omittable(fields[n]))
        if missing:
            return f"missing field {missing[0]!r}"
    for name, spec in fields.items():
        if isinstance(spec, Omittable):
            if name not in value:
                continue
            spec = spec.spec
        item = value[name]
        # The common scalar specs are tested inline: `audit verify` runs this per record.
        if spec is str:
            if type(item) is str:
                continue
        elif spec is int:
            if type(item) is int and 0 <= item <= MAX_SAFE_INTEGER:
                continue
        elif _valid(item, spec):
            continue
        return f"field {name!r} has an invalid value"
    return None


Check = Callable[[object], bool]


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_int(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _is_bool(value: object) -> bool:
    return type(value) is bool


def _compile(spec: object) -> Check:
    """A predicate equal to `_valid(value, spec)`, with the spec's dispatch done once."""
    if spec is str:
        return _is_str
    if spec is int:
        return _is_int
    if spec is bool:
        return _is_bool
    if isinstance(spec, dict):
        return _compile_fields(spec)
    if isinstance(spec, frozenset):
        allowed = spec
        return lambda value: type(value) in (str, int) and value in allowed
    if isinstance(spec, re.Pattern):
        match = spec.match
        return lambda value: type(value) is str and match(value) is not None
    if isinstance(spec, Optional):
        inner = _compile(spec.spec)
        return lambda value: value is None or inner(value)
    if isinstance(spec, ListOf):
        each = _compile(spec.spec)
        return lambda value: type(value) is list and all(map(each, value))
    raise TypeError(f"unknown schema spec {spec!r}")


def _omittable(spec: object) -> bool:
    return isinstance(spec, Omittable)


def _compile_fields(fields: Mapping[str, object]) -> Check:
    names = fields.keys()
    required = frozenset(name for name, spec in fields.items() if not _omittable(spec))
    checks = tuple(
        (name, _compile(spec.spec if isinstance(spec, Omittable) else spec))
        for name, spec in fields.items()
    )

    def check(value: object) -> bool:
        if type(value) is not dict:
            return False
        if value.keys() != names:  # some omittable field absent (or a wrong set)
            if not required <= value.keys() <= names:
                return False
            return all(valid(value[name]) for name, valid in checks if name in value)
        for name, valid in checks:  # noqa: SIM110 - faster than all() over a generator
            if not valid(value[name]):
                return False
        return True

    return check


_CHECKS: dict[str, Check] = {kind: _compile(schema) for kind, schema in RECORD_SCHEMAS.items()}


def problem(record: Mapping[str, object]) -> str | None:
    """None when `record` follows schema v1, else the first problem, for humans."""
    kind = record.get("type")
    schema = RECORD_SCHEMAS.get(kind) if isinstance(kind, str) else None
    if schema is None:
        return f"record type {kind!r} is not one of {', '.join(RECORD_SCHEMAS)}"
    if not _CHECKS[kind](record):  # type: ignore[index]
        found = fields_problem(record, schema)
        if found is not None:
            return f"{kind} record: {found}"
    if kind == "completion" and "usage_bound" in record:
        return usage_bound_problem(record["usage"], record["usage_bound"])  # type: ignore[arg-type]
    return None


def usage_bound_problem(usage: Mapping[str, int] | None, bound: int) -> str | None:
    """What is wrong with a completion's `usage_bound` next to its `usage`, else None.

    The bound is recorded only when the reported usage, `max(total_tokens, prompt_tokens +
    completion_tokens)`, exceeded it (docs/provenance.md): a bound without a usage, or
    one at or above the usage, says the tenant was charged what the backend never claimed.
    """
    if usage is None:
        return "completion record: usage_bound without a reported usage (it bounds one)"
    reported = max(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])
    if bound >= reported:
        return (
            f"completion record: usage_bound {bound} is not below the reported usage "
            f"{reported} (it is recorded only when the usage exceeded it)"
        )
    return None
