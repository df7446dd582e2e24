"""A statement's and a record's `time` is RFC 3339 in ASCII digits, or it is malformed.

The time patterns were written with `\\d`, which in a Python `str` pattern matches any
Unicode decimal digit: a sidecar's key holder (a compromised backend host) could sign a
statement dated `٢٠٢٦-01-01T...` (Arabic-Indic digits), and the gateway accepted it,
wrote that time into its own completion record, and `owngate audit verify` passed it,
while an RFC 3339 reader (ASCII DIGIT only: Go's `time.Parse`, a verifier written from
the docs) refuses the record: one log, two verdicts. The gateway's and the sidecar's own
records, which format the time themselves, never hold such digits.
"""

from __future__ import annotations

import base64

import pytest

from gateway.canonical import canonical_json_of_plain
from gateway.provenance import Salts, commit
from gateway.provenance.errors import RecordError
from gateway.provenance.formats.attestation import (
    ATTESTATION_PAYLOAD_TYPE,
    AttestationFailure,
    Statement,
    check_countersignature,
)
from gateway.provenance.formats.receipts import pae
from gateway.provenance.formats.record_parser import parse_record
from gateway.provenance.testing import CountingRandom, seeded_signer

SIGNER = seeded_signer("gpu-a")
SALTS = Salts.generate(CountingRandom())
REQUEST = commit("request", SALTS.request, b'{"model":"m","messages":[]}')
RESPONSE = commit("response", SALTS.response, b'{"choices":[]}')
# the year in Arabic-Indic digits, and the whole time in fullwidth ones
TIMES = [
    "\u0662\u0660\u0662\u0666-01-01T00:00:00.000Z",
    "\uff12\uff10\uff12\uff16-\uff10\uff11-\uff10\uff11T\uff10\uff10:\uff10\uff10:\uff10\uff10.\uff10\uff10\uff10Z",
]


def _record(time: str) -> dict[str, object]:
    return {
        "v": 1,
        "type": "attestation",
        "request_id": "req-1",
        "time": time,
        "counter": 3,
        "key": str(SIGNER),
        "request_commitment": REQUEST,
        "response_commitment": RESPONSE,
    }


def _signed(time: str) -> bytes:
    """A countersignature over a statement dated `time`, as its key holder can sign one."""
    payload = canonical_json_of_plain(_record(time))
    signature = SIGNER.sign(pae(ATTESTATION_PAYLOAD_TYPE, payload))
    return canonical_json_of_plain(
        {
            "payloadType": ATTESTATION_PAYLOAD_TYPE,
            "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": str(SIGNER), "sig": base64.b64encode(signature).decode()}],
        }
    )


def _check(envelope: bytes) -> None:
    check_countersignature(
        envelope,
        SIGNER.verifier(),
        request_id="req-1",
        request_commitment=REQUEST,
        response_commitment=RESPONSE,
    )


def test_a_statement_in_ascii_digits_is_accepted() -> None:
    _check(_signed("2026-01-01T00:00:00.000Z"))
    parse_record(canonical_json_of_plain(_record("2026-01-01T00:00:00.000Z")))


@pytest.mark.parametrize("time", TIMES)
def test_the_gateway_refuses_a_statement_dated_in_other_digits(time: str) -> None:
    with pytest.raises(AttestationFailure) as refused:
        _check(_signed(time))
    assert refused.value.code == "malformed"
    with pytest.raises(RecordError, match="time"):
        Statement("req-1", time, 3, str(SIGNER), REQUEST, RESPONSE)


@pytest.mark.parametrize("time", TIMES)
def test_a_record_dated_in_other_digits_is_malformed(time: str) -> None:
    # a sidecar log's entry as its key holder could write one, and the same time in any
    # record (a completion's `attestation.time` takes the record schema's pattern too)
    with pytest.raises(RecordError, match="'time' has an invalid value"):
        parse_record(canonical_json_of_plain(_record(time)))
