"""A statement's `key` is a signed-note key id (`name+8 hex digits`): what a backend
(or whatever answers at its address) writes there reaches the gateway's log (a
`wrong_key` failure names it) and the auditor's terminal (audit verify names it), so
anything else is a malformed countersignature, never text passed on."""

from __future__ import annotations

import base64
import json

import pytest

from gateway.api.attested import Attester
from gateway.api.metrics import GatewayMetrics
from gateway.api.trail import Trail
from gateway.canonical import canonical_json_of_plain
from gateway.provenance import MalformedError, RecordError, Salts, commit
from gateway.provenance.formats.attestation import (
    ATTESTATION_PAYLOAD_TYPE,
    AttestationFailure,
    Statement,
    check_countersignature,
    open_countersignature,
)
from gateway.provenance.formats.receipts import pae
from gateway.provenance.testing import CountingRandom, seeded_signer

SIGNER = seeded_signer("gpu-a")
SALTS = Salts.generate(CountingRandom("keys"))
REQUEST, RESPONSE = b'{"model":"m","messages":[]}', b'{"choices":[]}'
HOSTILE = [
    "gpu\x1b[2J\x1b[31m+0123abcd",  # terminal escapes
    "gpu\nlevel=error msg=forged+0123abcd",  # a log line of its own
    "gpu-a+0123ABCD",  # not the id's spelling
    "gpu-a",  # no id
    "x" * 300 + "+0123abcd",  # longer than any name
    "gpu a+0123abcd",  # a space: no key name
]


def _record(key: str) -> dict[str, object]:
    return {
        "v": 1,
        "type": "attestation",
        "request_id": "req-1",
        "time": "2026-01-01T00:00:00.000Z",
        "counter": 1,
        "key": key,
        "request_commitment": commit("request", SALTS.request, REQUEST),
        "response_commitment": commit("response", SALTS.response, RESPONSE),
    }


def _envelope(key: str) -> bytes:
    payload = json.dumps(_record(key)).encode()
    return json.dumps(
        {
            "payloadType": "application/vnd.owngate.attestation+json",
            "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": key, "sig": base64.b64encode(bytes(64)).decode()}],
        }
    ).encode()


@pytest.mark.parametrize("key", HOSTILE)
def test_a_statement_key_that_is_no_key_id_is_malformed(key: str) -> None:
    with pytest.raises(MalformedError) as caught:
        open_countersignature(_envelope(key))
    assert key not in str(caught.value)
    with pytest.raises(RecordError):
        Statement(**_fields(key))  # type: ignore[arg-type]
    trail = Trail(SALTS, commit("request", SALTS.request, REQUEST))
    trail.answered(RESPONSE)
    Attester("gpu", SIGNER.vkey, GatewayMetrics()).judge(
        trail, "req-1", base64.b64encode(_envelope(key))
    )
    assert trail.attestation is not None and trail.attestation.failure == "malformed"


def _fields(key: str) -> dict[str, object]:
    record = _record(key)
    return {name: record[name] for name in Statement.__dataclass_fields__}


def test_a_key_id_is_a_statement_key() -> None:
    assert Statement(**_fields(str(SIGNER))).key == str(SIGNER)  # type: ignore[arg-type]
    assert Statement(**_fields("owngate-demo.internal/gpu-vllm+0123abcd")).key  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"v": True}, "version (v) must be the integer 1"),
        ({"v": 2}, "version (v) must be the integer 1"),
        ({"type": "dispatch"}, "type must be attestation"),
        ({"extra": 1}, "exactly the fields"),
    ],
    ids=["true", "two", "type", "field"],
)
def test_a_statement_of_another_version_or_shape_is_malformed_and_says_why(
    change: dict[str, object], said: str
) -> None:
    # `true == 1` in Python: a statement signed with `"v": true` was taken for version 1,
    # re-encoded with `"v":1`, and refused as "invalid signature for key" (bad_signature)
    # though its signature was sound: the problem is its version.
    record = {**_record(str(SIGNER)), **change}
    payload = canonical_json_of_plain(record)
    envelope = json.dumps(
        {
            "payloadType": ATTESTATION_PAYLOAD_TYPE,
            "payload": base64.b64encode(payload).decode(),
            "signatures": [
                {
                    "keyid": str(SIGNER),
                    "sig": base64.b64encode(
                        SIGNER.sign(pae(ATTESTATION_PAYLOAD_TYPE, payload))
                    ).decode(),
                }
            ],
        }
    ).encode()
    with pytest.raises(AttestationFailure) as refused:
        check_countersignature(
            envelope,
            SIGNER.verifier(),
            request_id="req-1",
            request_commitment=str(record["request_commitment"]),
            response_commitment=str(record["response_commitment"]),
        )
    assert refused.value.code == "malformed", refused.value
    assert said in str(refused.value), refused.value
