"""Receipts: the client's proof that the gateway logged its request, signed by the log's
Ed25519 key, in one of two forms (docs/provenance.md, "Receipts").

* v1, per request: a DSSE v1 envelope of the payload (`receipt_payload.Receipt`, type
  `application/vnd.owngate.receipt+json`), its signature over DSSE's PAE:
  `"DSSEv1" SP len(type) SP type SP len(payload) SP payload`.
* v2, per batch: the same payload, beside the DSSE envelope of the batch statement that
  signs the Merkle root of every receipt payload of one committed batch, and the
  payload's inclusion path in it (`receipt_batch`).

`verify_receipt` takes either. With the salts a receipt opens the commitments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from gateway.canonical import canonical_json, canonical_json_of_plain
from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.dsse import (
    MAX_SIGNATURES,
    decode_base64,
    loads_strict,
    pae,
    signed_envelope,
    verify_signatures,
)
from gateway.provenance.formats.note import Signer, Verifier
from gateway.provenance.formats.receipt_batch import is_batch_receipt, verify_batch_receipt
from gateway.provenance.formats.receipt_payload import RECEIPT_PAYLOAD_TYPE, Receipt

__all__ = [
    "MAX_RECEIPT_BYTES",
    "MAX_SIGNATURES",
    "RECEIPT_PAYLOAD_TYPE",
    "Receipt",
    "attach_countersignature",
    "countersignature_of",
    "make_receipt",
    "pae",
    "receipt_claims",
    "receipt_version",
    "verify_receipt",
]


# A receipt is 1-3 KB (v2 with a path of 10 hashes and a backend's countersignature):
# anything far beyond that is refused unparsed, whoever hands it to a verifier.
MAX_RECEIPT_BYTES = 64 * 1024


def make_receipt(receipt: Receipt, signer: Signer) -> bytes:
    """The v1 DSSE envelope (canonical JSON bytes) for `receipt`, signed by `signer`."""
    # Plain by construction: ASCII names, strings, and a log index far below 2**53.
    payload = canonical_json_of_plain(receipt.payload())
    return canonical_json_of_plain(signed_envelope(RECEIPT_PAYLOAD_TYPE, payload, signer))


def attach_countersignature(envelope: bytes, countersignature: bytes) -> bytes:
    """The receipt with an attested backend's countersignature (its own DSSE envelope)
    beside the gateway's: a member `attestation` of the receipt's JSON. It is signed by
    the backend's key, not the gateway's: DSSE verifiers that do not know it ignore it."""
    value = json.loads(envelope)
    value["attestation"] = json.loads(countersignature)
    return canonical_json_of_plain(value)


def countersignature_of(envelope: bytes) -> bytes | None:
    """The countersignature a receipt carries (canonical JSON bytes), or None."""
    value = loads_strict(envelope, "receipt")
    found = value.get("attestation") if isinstance(value, dict) else None
    if found is None:
        return None
    try:  # the holder's to shape: not plain by construction
        return canonical_json(found)
    except (TypeError, ValueError, RecursionError) as exc:
        raise MalformedError(f"receipt's countersignature cannot be encoded: {exc}") from exc


def receipt_version(envelope: bytes) -> int:
    """2 for a batch receipt, 1 otherwise (for display: `verify_receipt` checks it)."""
    value = loads_strict(envelope, "receipt")
    return 2 if isinstance(value, dict) and is_batch_receipt(value) else 1


def verify_receipt(envelope: bytes, verifiers: Iterable[Verifier]) -> Receipt:
    """Check a receipt (v1 or v2) against trusted keys; returns its payload.

    Raises MalformedError for a bad envelope (or one over MAX_RECEIPT_BYTES, unparsed),
    SignatureError unless a trusted key signed it (a signature naming a trusted key that
    fails to verify is an error too) and, for a v2 receipt, ProofError when its path does
    not lead to the signed root.
    """
    if len(envelope) > MAX_RECEIPT_BYTES:
        raise MalformedError(f"receipt is over {MAX_RECEIPT_BYTES} bytes")
    value = loads_strict(envelope, "receipt")
    if not isinstance(value, dict) or value.get("payloadType") != RECEIPT_PAYLOAD_TYPE:
        raise MalformedError(f"receipt is not a DSSE envelope of {RECEIPT_PAYLOAD_TYPE}")
    if is_batch_receipt(value):
        return verify_batch_receipt(value, verifiers)
    payload = decode_base64(value.get("payload"), "payload")
    verify_signatures(RECEIPT_PAYLOAD_TYPE, payload, value.get("signatures"), verifiers)
    return Receipt.from_payload(loads_strict(payload, "receipt payload"))


def receipt_claims(envelope: bytes) -> Receipt:
    """What a receipt's payload claims, its signature not checked: which entry it names,
    for `owngate audit prove --receipt` to prove (the proof is then checked against the
    receipt, signature and all, by `owngate audit proof verify --receipt`)."""
    if len(envelope) > MAX_RECEIPT_BYTES:
        raise MalformedError(f"receipt is over {MAX_RECEIPT_BYTES} bytes")
    value = loads_strict(envelope, "receipt")
    if not isinstance(value, dict) or value.get("payloadType") != RECEIPT_PAYLOAD_TYPE:
        raise MalformedError(f"receipt is not a DSSE envelope of {RECEIPT_PAYLOAD_TYPE}")
    payload = decode_base64(value.get("payload"), "payload")
    return Receipt.from_payload(loads_strict(payload, "receipt payload"))
