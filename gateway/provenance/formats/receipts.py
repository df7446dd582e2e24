"""Per-request receipts: DSSE v1 envelopes signed by the log's Ed25519 key.

The payload (RFC 8785 JSON, type `application/vnd.owngate.receipt+json`) names the log,
the dispatch record's leaf index and hash, the backend, the policy digest and the two
commitment salts; the signature is over DSSE's PAE:
`"DSSEv1" SP len(type) SP type SP len(payload) SP payload`. A receipt is the client's
proof that the gateway logged its request; with the salts it can open the commitments.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.canonical import canonical_json_of_plain
from gateway.provenance.errors import MalformedError, SignatureError
from gateway.provenance.formats.commitments import Salts
from gateway.provenance.formats.note import Signer, Verifier

__all__ = [
    "RECEIPT_PAYLOAD_TYPE",
    "Receipt",
    "attach_countersignature",
    "countersignature_of",
    "make_receipt",
    "pae",
    "verify_receipt",
]

RECEIPT_PAYLOAD_TYPE = "application/vnd.owngate.receipt+json"
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")  # a SHA-256 hash or a 32-byte salt


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


@dataclass(frozen=True, slots=True)
class Receipt:
    request_id: str
    log: str  # the log's checkpoint origin
    index: int  # leaf index of the dispatch record
    dispatch_hash: bytes  # RFC 6962 leaf hash of the dispatch record
    backend: str
    policy_digest: str
    salts: Salts

    def payload(self) -> dict[str, object]:
        return {
            "v": 1,
            "request_id": self.request_id,
            "log": self.log,
            "index": self.index,
            "dispatch_hash": self.dispatch_hash.hex(),
            "backend": self.backend,
            "policy_digest": self.policy_digest,
            "salts": {"request": self.salts.request.hex(), "response": self.salts.response.hex()},
        }

    @classmethod
    def from_payload(cls, value: object) -> Receipt:
        expected = {"v", "request_id", "log", "index", "dispatch_hash", "backend"}
        expected |= {"policy_digest", "salts"}
        if not isinstance(value, dict) or set(value) != expected or value["v"] != 1:
            raise MalformedError(f"receipt payload must have exactly {sorted(expected)}, v=1")
        salts = value["salts"]
        strings = ("request_id", "log", "backend", "policy_digest")
        if (
            not all(isinstance(value[name], str) for name in strings)
            or not isinstance(value["index"], int)
            or isinstance(value["index"], bool)
            or value["index"] < 0
            or not isinstance(value["dispatch_hash"], str)
            or not _HEX64.match(value["dispatch_hash"])
            or not isinstance(salts, dict)
            or set(salts) != {"request", "response"}
            or not all(isinstance(s, str) and _HEX64.match(s) for s in salts.values())
        ):
            raise MalformedError("receipt payload has a field of the wrong type")
        return cls(
            request_id=value["request_id"],
            log=value["log"],
            index=value["index"],
            dispatch_hash=bytes.fromhex(value["dispatch_hash"]),
            backend=value["backend"],
            policy_digest=value["policy_digest"],
            salts=Salts(bytes.fromhex(salts["request"]), bytes.fromhex(salts["response"])),
        )


def make_receipt(receipt: Receipt, signer: Signer) -> bytes:
    """The DSSE envelope (canonical JSON bytes) for `receipt`, signed by `signer`."""
    # Plain by construction: ASCII names, strings, and a log index far below 2**53.
    payload = canonical_json_of_plain(receipt.payload())
    signature = signer.sign(pae(RECEIPT_PAYLOAD_TYPE, payload))
    envelope = {
        "payloadType": RECEIPT_PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": str(signer), "sig": base64.b64encode(signature).decode()}],
    }
    return canonical_json_of_plain(envelope)


def attach_countersignature(envelope: bytes, countersignature: bytes) -> bytes:
    """The receipt with an attested backend's countersignature (its own DSSE envelope)
    beside the gateway's: a member `attestation` of the receipt's JSON. It is signed by
    the backend's key, not the gateway's: DSSE verifiers that do not know it ignore it."""
    value = json.loads(envelope)
    value["attestation"] = json.loads(countersignature)
    return canonical_json_of_plain(value)


def countersignature_of(envelope: bytes) -> bytes | None:
    """The countersignature a receipt carries (canonical JSON bytes), or None."""
    try:
        value = json.loads(envelope)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedError(f"receipt is not JSON: {exc}") from exc
    found = value.get("attestation") if isinstance(value, dict) else None
    return None if found is None else canonical_json_of_plain(found)


def _decode(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedError(f"receipt {what} is not a string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise MalformedError(f"receipt {what} is not valid base64") from exc


# A receipt carries the gateway's signature (and one per earlier key at most, after a
# rotation); anything far beyond that is an attempt to make verification expensive.
MAX_SIGNATURES = 8


def verify_receipt(envelope: bytes, verifiers: Iterable[Verifier]) -> Receipt:
    """Check a receipt envelope against trusted keys; returns its payload.

    Raises MalformedError for a bad envelope and SignatureError unless a trusted key
    signed it (a signature naming a trusted key that fails to verify is an error too).
    """
    try:
        value = json.loads(envelope)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # nested deep
        raise MalformedError(f"receipt is not JSON: {exc}") from exc
    if not isinstance(value, dict) or value.get("payloadType") != RECEIPT_PAYLOAD_TYPE:
        raise MalformedError(f"receipt is not a DSSE envelope of {RECEIPT_PAYLOAD_TYPE}")
    payload = _decode(value.get("payload"), "payload")
    signatures = value.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise MalformedError("receipt envelope has no signatures")
    if len(signatures) > MAX_SIGNATURES:  # each costs a verification against every key
        raise MalformedError(f"receipt envelope has over {MAX_SIGNATURES} signatures")
    message = pae(RECEIPT_PAYLOAD_TYPE, payload)
    trusted = list(verifiers)
    verified = False
    for item in signatures:
        if not isinstance(item, dict):
            raise MalformedError("receipt signature is not an object")
        signature = _decode(item.get("sig"), "signature")
        keyid = item.get("keyid")
        named = [v for v in trusted if str(v) == keyid]
        if named:
            named[0].verify(message, signature)  # raises SignatureError
            verified = True
            continue
        for candidate in trusted:  # no or unknown key id: any trusted key may match
            try:
                candidate.verify(message, signature)
            except SignatureError:
                continue
            verified = True
            break
    if not verified:
        keys = ", ".join(str(v) for v in trusted) or "none"
        raise SignatureError(f"receipt is not signed by a trusted key (trusted: {keys})")
    try:
        return Receipt.from_payload(json.loads(payload))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedError(f"receipt payload is not JSON: {exc}") from exc
