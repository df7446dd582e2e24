"""A completion's `status` is the final HTTP status the client got, 200-599: the only
statuses the gateway relays or writes. `audit verify --backend-key` needs a
countersignature on an answer below 400 alone, so a record with a status no client can
get (999, 2**53, 0, a 1xx) must not be a valid record: before, a gateway holding the log
key could write a countersigned 200 answer as status 999 without its countersignature and
the audit passed it as an error needing none (docs/provenance.md, records)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.canonical import canonical_json
from gateway.provenance.errors import RecordError
from gateway.provenance.formats.records import (
    LogEntry,
    completion_record,
    parse_record,
    validate_record,
)

TIME = datetime(2026, 1, 1, tzinfo=UTC)


def _completion(status: int) -> dict[str, object]:
    return completion_record(
        request_id="req_" + "0" * 24,
        time=TIME,
        dispatch=LogEntry(0, b"\x01" * 32),
        status=status,
        error=None,
        usage=None,
        latency_ms=1,
        response_commitment="ab" * 32,
    )


@pytest.mark.parametrize("status", [0, 99, 100, 101, 199, 600, 999, 1000, 2**53])
def test_a_status_no_client_can_get_is_not_a_valid_completion(status: int) -> None:
    written = {**_completion(200), "status": status}
    with pytest.raises(RecordError, match="status"):
        validate_record(written)
    with pytest.raises(RecordError, match="status"):
        parse_record(canonical_json(written))
    with pytest.raises(RecordError, match="status"):
        _completion(status)  # nor does the gateway write one


@pytest.mark.parametrize("status", [200, 204, 399, 400, 429, 499, 502, 503, 504, 599])
def test_every_status_the_gateway_writes_is_valid(status: int) -> None:
    record = _completion(status)
    assert parse_record(canonical_json(record)).data["status"] == status


def test_a_status_that_is_not_an_integer_is_refused() -> None:
    for status in (True, 200.0, "200"):
        with pytest.raises(RecordError):
            validate_record({**_completion(200), "status": status})
