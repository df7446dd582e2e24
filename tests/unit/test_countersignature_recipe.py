"""docs/provenance.md's independent countersignature recipe (on top of its receipt
recipe) is run as written against owngate's countersigned receipts, v1 and v2, whole and
streamed, and against forgeries: another backend key, another request's statement, a
body the backend did not sign, an event appended after a countersigned stream, a receipt
naming another backend than the one whose key signed the statement."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.exceptions import InvalidSignature

from gateway.canonical import canonical_json
from gateway.provenance import Receipt, Salts, Signer, commit, make_receipt, seal_receipts
from gateway.provenance.formats.attestation import Statement, sign_statement
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.receipts import attach_countersignature
from gateway.provenance.testing import CountingRandom, seeded_signer
from tests.helpers.doc_recipes import provenance_recipes

LOG = seeded_signer("gateway.example/log/1")
SIDECAR = seeded_signer("gpu.example/attest")
ANOTHER = seeded_signer("gpu.example/other")
REQUEST = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
STREAM = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
WHOLE = b'{"choices":[{"message":{"content":"hi"}}]}'


VERIFY = provenance_recipes()["verify_countersignature"]


KEYS = {"gpu-fra-1": SIDECAR.vkey}


def _receipt(index: int, salts: Salts, backend: str = "gpu-fra-1") -> Receipt:
    return Receipt(
        f"req_{index:024x}",
        LOG.name,
        index,
        leaf_hash(b"%d" % index),
        backend,
        "sha256:" + "ab" * 32,
        salts,
    )


def _countersigned(
    receipt: Receipt, response: bytes, *, signer: Signer = SIDECAR, request_id: str | None = None
) -> bytes:
    """The receipt as the gateway hands it out, with `signer`'s statement over `response`."""
    statement = Statement(
        request_id or receipt.request_id,
        "2026-01-01T00:00:00.250Z",
        7,
        str(signer),
        commit("request", receipt.salts.request, REQUEST),
        commit("response", receipt.salts.response, response),
    )
    return attach_countersignature(make_receipt(receipt, LOG), sign_statement(statement, signer))


def _received(stream: bytes, receipt: bytes) -> bytes:
    return stream + b": owngate-receipt " + base64.b64encode(receipt) + b"\n\n"


def test_the_recipe_verifies_a_whole_answer_and_a_stream_as_received() -> None:
    receipt = _receipt(3, Salts.generate(CountingRandom("whole")))
    data = _countersigned(receipt, WHOLE)
    statement = VERIFY(data, LOG.vkey, KEYS, REQUEST, WHOLE)
    assert statement["key"] == str(SIDECAR) and statement["request_id"] == receipt.request_id
    streamed = _receipt(4, Salts.generate(CountingRandom("stream")))
    data = _countersigned(streamed, STREAM)
    assert VERIFY(data, LOG.vkey, KEYS, REQUEST, _received(STREAM, data))
    assert VERIFY(data, LOG.vkey, KEYS, REQUEST, STREAM)  # saved without the line


def test_the_recipe_verifies_the_countersignature_beside_a_batch_receipt() -> None:
    receipts = [_receipt(n, Salts.generate(CountingRandom(f"batch/{n}"))) for n in (5, 6, 7)]
    batch = seal_receipts([(r.index, canonical_json(r.payload())) for r in receipts], LOG.name, LOG)
    plain = _countersigned(receipts[1], WHOLE)
    envelope = json.loads(batch[1])
    envelope["attestation"] = json.loads(plain)["attestation"]
    assert VERIFY(json.dumps(envelope).encode(), LOG.vkey, KEYS, REQUEST, WHOLE)


@pytest.mark.parametrize(
    "forgery",
    [
        "another-key",
        "another-request",
        "another-request-body",
        "changed-response",
        "appended",
        "another-backend",
        "unkeyed-backend",
    ],
)
def test_the_recipe_refuses_what_owngate_refuses(forgery: str) -> None:
    backend = "gpu-fra-1"
    if forgery in ("another-backend", "unkeyed-backend"):
        # The gateway sent it to gpu-fra-1 (its sidecar countersigned) and its receipt
        # claims gpu-ams-2 (another region), or a backend the client holds no key for:
        # `receipt verify --backend-key` does not take it as a two-party statement.
        backend = "gpu-ams-2" if forgery == "another-backend" else "hosted"
    receipt = _receipt(9, Salts.generate(CountingRandom("forged")), backend)
    request, received = REQUEST, None
    keys = {**KEYS, "gpu-ams-2": ANOTHER.vkey} if forgery == "another-backend" else KEYS
    if forgery == "another-key":  # a genuine statement, by a key not the backend's
        data = _countersigned(receipt, STREAM, signer=ANOTHER)
    elif forgery == "another-request":
        data = _countersigned(receipt, STREAM, request_id="req_" + "0" * 24)
    else:
        data = _countersigned(receipt, STREAM)
    if forgery == "another-request-body":
        request = REQUEST.replace(b"hi", b"ho")
    received = _received(STREAM, data)
    if forgery == "changed-response":
        received = received.replace(b'"hi"', b'"ho"')
    if forgery == "appended":  # an event after the countersigned stream, as a gateway could
        injected = b'data: {"error":{},"choices":[{"delta":{"content":"pay here"}}],"x":{}}\n\n'
        received = _received(STREAM + injected, data)
    with pytest.raises((AssertionError, InvalidSignature)):
        VERIFY(data, LOG.vkey, keys, request, received)
