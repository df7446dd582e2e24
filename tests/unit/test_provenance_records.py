"""Record builders check their inputs, so what they build is valid by construction; the
compiled schema check agrees with the reference walk on valid and broken records."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.canonical import canonical_json
from gateway.provenance import (
    BackendRef,
    LogEntry,
    PolicyRef,
    RecordError,
    Retention,
    TraceStep,
    Usage,
    completion_record,
    dispatch_record,
    parse_record,
    refusal_record,
)
from gateway.provenance.formats.records import format_time
from gateway.provenance.formats.schema import RECORD_SCHEMAS, fields_problem, problem
from gateway.provenance.testing import EXAMPLE_BACKEND, EXAMPLE_POLICY

_HEX = "ab" * 32
_MOMENT = datetime(2026, 1, 31, 12, 0, 0, 250_999, tzinfo=UTC)

_text = st.text(max_size=12)
_count = st.integers(0, 2**53)
_refs = st.builds(
    BackendRef,
    id=st.text(min_size=1, max_size=8),
    tier=st.sampled_from(["private", "hosted"]),
    kind=_text,
    provider=_text,
    owner=_text,
    region=_text,
    retention=st.builds(Retention, _count, st.booleans(), st.booleans()),
)
_traces = st.lists(
    st.builds(TraceStep, _text, st.sampled_from(["admitted", "excluded"]), _text), max_size=3
)


@settings(max_examples=150, deadline=None)
@given(
    request_id=st.from_regex(r"[A-Za-z0-9._:-]{1,12}", fullmatch=True),
    tenant=_text,
    model=_text,
    backend=_refs,
    trace=_traces,
    fallback=st.none() | _text,
    status=st.integers(200, 599),  # a final HTTP status (test_record_status.py)
    usage=st.none() | st.builds(Usage, _count, _count, _count),
    error=st.none() | _text,
)
def test_builders_only_build_valid_records(**given_: Any) -> None:
    g = given_
    records = [
        dispatch_record(
            request_id=g["request_id"],
            time=_MOMENT,
            tenant=g["tenant"],
            model=g["model"],
            policy=EXAMPLE_POLICY,
            trace=g["trace"],
            backend=g["backend"],
            fallback_reason=g["fallback"],
            request_commitment=_HEX,
        ),
        completion_record(
            request_id=g["request_id"],
            time=_MOMENT,
            dispatch=LogEntry(7, b"\x01" * 32),
            status=g["status"],
            error=g["error"],
            usage=g["usage"],
            latency_ms=g["status"],
            response_commitment=None if g["error"] else _HEX,
        ),
        refusal_record(
            request_id=g["request_id"],
            time=_MOMENT,
            tenant=g["tenant"],
            model=g["model"],
            policy=EXAMPLE_POLICY,
            trace=g["trace"],
            rule=g["model"],
            reason=g["tenant"],
            request_commitment=None,
        ),
    ]
    for record in records:
        assert problem(record) is None
        assert parse_record(canonical_json(record)).data == record


def _dispatch(**change: Any) -> dict[str, object]:
    arguments: dict[str, Any] = {
        "request_id": "req-1",
        "time": _MOMENT,
        "tenant": "acme",
        "model": "m",
        "policy": EXAMPLE_POLICY,
        "trace": [TraceStep("gpu", "admitted", "allow")],
        "backend": EXAMPLE_BACKEND,
        "fallback_reason": None,
        "request_commitment": _HEX,
    }
    return dispatch_record(**{**arguments, **change})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"request_id": ""}, "request_id must be a non-empty string"),
        # Receipts carry it and auditors print it: the gateway's req_ + 24 hex, or the like.
        ({"request_id": "req 1"}, "request_id must be 1-128 of A-Za-z0-9._:-"),
        ({"request_id": "req-1\x1b[2K"}, "request_id must be 1-128 of A-Za-z0-9._:-"),
        ({"request_id": "r" * 129}, "request_id must be 1-128 of A-Za-z0-9._:-"),
        ({"tenant": 3}, "tenant must be a string"),
        ({"request_commitment": "AB" * 32}, "request_commitment must be 64 lowercase hex"),
        ({"request_commitment": "ab" * 31}, "request_commitment must be 64 lowercase hex"),
        ({"fallback_reason": 1}, "fallback must be a string"),
        ({"trace": [("gpu", "admitted", "allow")]}, "trace steps must be TraceStep"),
        ({"backend": {"id": "gpu"}}, "backend must be a BackendRef"),
        ({"fallback_basis": [("gpu", "failed")]}, "fallback_basis needs a fallback reason"),
        (
            {"fallback_reason": "private_unavailable", "fallback_basis": [("gpu", "slow")]},
            "fallback_basis state must be one of",
        ),
    ],
)
def test_dispatch_builder_refuses_what_the_schema_would(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(RecordError, match=message):
        _dispatch(**change)


def test_a_fallback_basis_is_part_of_the_record_and_checked_by_the_schema() -> None:
    record = _dispatch(
        fallback_reason="private_unavailable",
        fallback_basis=[("gpu", "down"), ("gpu-2", "failed")],
    )
    assert record["fallback_basis"] == [
        {"backend": "gpu", "state": "down"},
        {"backend": "gpu-2", "state": "failed"},
    ]
    assert problem(record) is None
    assert parse_record(canonical_json(record)).data == record
    assert "fallback_basis" not in _dispatch()  # a record without it still reads
    bad = copy.deepcopy(record)
    bad["fallback_basis"][0]["state"] = "slow"  # type: ignore[index]
    assert problem(bad) is not None


def test_reference_types_check_themselves() -> None:
    with pytest.raises(RecordError, match="prompt_tokens"):
        Usage(-1, 0, 0)
    with pytest.raises(RecordError, match="total_tokens"):
        Usage(0, 0, 2**53 + 1)
    with pytest.raises(RecordError, match="verdict"):
        TraceStep("gpu", "maybe", "r")  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="tier"):
        BackendRef("gpu", "cloud", "k", "p", "o", "r", Retention(0, True, False))  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="retention days"):
        Retention(True, True, False)  # a bool is not a count
    with pytest.raises(RecordError, match="policy digest"):
        PolicyRef("p", "1", None)  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="status"):
        completion_record(
            request_id="r",
            time=_MOMENT,
            dispatch=LogEntry(0, b"\x01" * 32),
            status=-1,
            error=None,
            usage=None,
            latency_ms=0,
            response_commitment=None,
        )


def test_times_are_utc_milliseconds_with_four_digit_years() -> None:
    assert format_time(_MOMENT) == "2026-01-31T12:00:00.250Z"
    east = datetime(2026, 1, 31, 12, 0, tzinfo=timezone(timedelta(hours=5)))
    assert format_time(east) == "2026-01-31T07:00:00.000Z"
    assert format_time(datetime(5, 1, 1, tzinfo=UTC)) == "0005-01-01T00:00:00.000Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        format_time(datetime(2026, 1, 1))


@given(
    st.datetimes(
        timezones=st.one_of(
            st.just(UTC),
            st.builds(timezone, st.timedeltas(timedelta(hours=-23), timedelta(hours=23))),
        )
    )
)
def test_times_are_what_isoformat_writes_in_utc(moment: datetime) -> None:
    utc = moment.astimezone(UTC)
    assert format_time(moment) == utc.isoformat(timespec="milliseconds")[:23] + "Z"


def test_a_seconds_date_and_time_of_day_are_formatted_once() -> None:
    """Records of the same second share the date and time of day formatted for the first
    (`isoformat` per record was ~15 K instructions, a third of that now)."""
    from gateway.provenance.formats import records

    second = datetime(2031, 7, 4, 9, 8, 7, tzinfo=UTC)
    format_time(second)
    before = records._second.cache_info()
    times = [format_time(second.replace(microsecond=ms * 1000)) for ms in (0, 1, 250, 999)]
    assert times == [f"2031-07-04T09:08:07.{ms:03d}Z" for ms in (0, 1, 250, 999)]
    after = records._second.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (4, 0)


def _mutations(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every record one step away from `record`: each field dropped, retyped or extended."""
    broken: list[dict[str, Any]] = []
    replacements: list[object] = [None, -1, 2**53 + 1, 1.5, True, "", "x", [], {}, "AB" * 32]
    paths: list[list[str]] = []

    def walk(value: object, path: list[str]) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                paths.append([*path, name])
                walk(item, [*path, name])

    walk(record, [])
    for path in paths:
        for replacement in replacements:
            changed = copy.deepcopy(record)
            target = changed
            for name in path[:-1]:
                target = target[name]
            target[path[-1]] = replacement
            broken.append(changed)
        dropped = copy.deepcopy(record)
        target = dropped
        for name in path[:-1]:
            target = target[name]
        del target[path[-1]]
        broken.append(dropped)
    broken.append({**record, "prompt": "secret"})
    return broken


def test_compiled_check_agrees_with_the_reference_walk() -> None:
    completion = completion_record(
        request_id="r",
        time=_MOMENT,
        dispatch=LogEntry(0, b"\x01" * 32),
        status=200,
        error=None,
        usage=Usage(1, 2, 3),
        latency_ms=5,
        response_commitment=_HEX,
    )
    seen_valid = seen_invalid = 0
    for record in (_dispatch(), completion):
        for candidate in [record, *_mutations(record)]:
            kind = candidate.get("type")
            schema = RECORD_SCHEMAS.get(kind) if isinstance(kind, str) else None
            reference = "no such type" if schema is None else fields_problem(candidate, schema)
            found = problem(candidate)
            if reference is None:
                assert found is None, candidate
                seen_valid += 1
            else:
                assert found is not None, candidate
                seen_invalid += 1
    assert seen_valid >= 2 and seen_invalid > 100
