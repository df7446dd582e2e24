"""Two-party statements: a backend host's countersignature of what it served.

The `owngate attest` sidecar beside a private inference server signs, for every request
it relays, a statement: the request id the gateway sent, the salted commitments to the
request body it received and the response body it sent (computed with the gateway's own
`commitments` functions and the salts the gateway passed along), its own counter, the
time, and its key id. The statement is RFC 8785 JSON, `type` `attestation`, and is also
the entry the sidecar appends to its own log; its signature is DSSE v1 (the receipts'
PAE) with payload type `application/vnd.owngate.attestation+json`, by the sidecar's
Ed25519 signed-note key.

The gateway stores the signature in its completion record as the `attestation` field
(`key`, `counter`, `time`, `sig`), not the statement: the statement is rebuilt from the
records (request id, the dispatch's request commitment, the completion's response
commitment), so the signature only verifies when both parties committed to the same
bytes. A countersignature the gateway could not accept is stored with `sig` null and a
`failure` code, never as a two-party statement.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.canonical import MAX_SAFE_INTEGER, canonical_json_of_plain
from gateway.provenance.errors import MalformedError, RecordError, SignatureError
from gateway.provenance.formats.commitments import Salts
from gateway.provenance.formats.dsse import loads_strict
from gateway.provenance.formats.note import Signer, Verifier
from gateway.provenance.formats.receipts import Receipt, countersignature_of, pae

__all__ = [
    "ATTESTATION_PAYLOAD_TYPE",
    "ATTEST_HEADER",
    "FAILURES",
    "SALTS_HEADER",
    "SSE_PREFIX",
    "Attestation",
    "AttestationFailure",
    "Countersignature",
    "Statement",
    "check_countersignature",
    "one_key_per_backend",
    "open_countersignature",
    "parse_salts",
    "receipt_countersignature",
    "salts_value",
    "sign_statement",
    "statement_of_records",
]

ATTESTATION_PAYLOAD_TYPE = "application/vnd.owngate.attestation+json"
# Why the gateway did not accept a countersignature (the completion record's `failure`).
FAILURES = frozenset({"missing", "malformed", "wrong_key", "bad_signature", "mismatch", "replayed"})
# On the wire between gateway and sidecar: the salts go in, the countersignature comes
# back in a header (whole answers) or a final SSE comment line (streams).
SALTS_HEADER = b"x-owngate-salts"
ATTEST_HEADER = b"x-owngate-attest"
SSE_PREFIX = b": owngate-attest "
# `x-owngate-salts`: two salts of 64 lower-case hex digits, a dot between (`parse_salts`)
_SALTS_SIZE = 129
_LOWER_HEX = b"0123456789abcdef"
MAX_ENVELOPE = 4096  # a countersignature is ~600 bytes: anything longer is not one
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
# ASCII digits: `\d` in a str pattern is any Unicode digit (`٢٠٢٦`), which RFC 3339
# readers refuse
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z\Z")
# A signed-note key id, `name+hexid`, as `str(Signer)` writes it: a name without blanks or
# '+' (and nothing unprintable, bounded) and the 8 hex digits. Text from the wire that
# reaches the gateway's log and the auditor's terminal: nothing else is a key.
_KEY = re.compile(r"[^\s+]{1,256}\+[0-9a-f]{8}\Z")
_FIELDS = frozenset(
    {"v", "type", "request_id", "time", "counter", "key"}
    | {"request_commitment", "response_commitment"}
)


def salts_value(salts: Salts) -> bytes:
    """The `x-owngate-salts` header value: the request and the response salt, hex."""
    return (salts.request.hex() + "." + salts.response.hex()).encode()


def parse_salts(value: bytes | None) -> Salts | None:
    """The salts of an `x-owngate-salts` value (None when absent or malformed)."""
    # On the sidecar's path of every request: a length, a dot and the digits checked with
    # `bytes.translate` (what is left once the digits are deleted), not a regular
    # expression over 129 bytes.
    if value is None or len(value) != _SALTS_SIZE or value[64] != 0x2E:  # "."
        return None
    request, response = value[:64], value[65:]
    if request.translate(None, _LOWER_HEX) or response.translate(None, _LOWER_HEX):
        return None
    return Salts(binascii.unhexlify(request), binascii.unhexlify(response))


@dataclass(frozen=True, slots=True)
class Statement:
    """What the backend host signs (and logs) for one request."""

    request_id: str
    time: str  # RFC 3339 UTC, milliseconds
    counter: int  # the sidecar's own, increasing per statement
    key: str  # the signing key's id, `name+hexid`
    request_commitment: str
    response_commitment: str

    def __post_init__(self) -> None:
        if type(self.request_id) is not str or not self.request_id:
            raise RecordError("statement request_id must be a non-empty string")
        if type(self.time) is not str or not _TIME.match(self.time):
            raise RecordError("statement time must be RFC 3339 UTC with milliseconds")
        if type(self.counter) is not int or not 0 <= self.counter <= MAX_SAFE_INTEGER:
            raise RecordError("statement counter must be an integer 0..2**53")
        if type(self.key) is not str or not _KEY.match(self.key) or not self.key.isprintable():
            raise RecordError("statement key must be a key id, name+8 hex digits")
        for name in ("request_commitment", "response_commitment"):
            value = getattr(self, name)
            if type(value) is not str or not _HEX64.match(value):
                raise RecordError(f"statement {name} must be 64 lowercase hex digits")

    def record(self) -> dict[str, object]:
        """The statement as a log record (the sidecar's log entry) and DSSE payload."""
        return {
            "v": 1,
            "type": "attestation",
            "request_id": self.request_id,
            "time": self.time,
            "counter": self.counter,
            "key": self.key,
            "request_commitment": self.request_commitment,
            "response_commitment": self.response_commitment,
        }

    def payload(self) -> bytes:
        return canonical_json_of_plain(self.record())

    @classmethod
    def from_record(cls, value: Mapping[str, Any]) -> Statement:
        if set(value) != _FIELDS:
            raise MalformedError(f"a statement has exactly the fields {sorted(_FIELDS)}")
        if type(value["v"]) is not int or value["v"] != 1:  # `true == 1` in Python
            raise MalformedError("a statement's version (v) must be the integer 1")
        if value["type"] != "attestation":
            raise MalformedError("a statement's type must be attestation")
        try:
            return cls(
                value["request_id"],
                value["time"],
                value["counter"],
                value["key"],
                value["request_commitment"],
                value["response_commitment"],
            )
        except RecordError as exc:
            raise MalformedError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class Countersignature:
    """A statement and the sidecar's signature over it, as sent to the gateway."""

    statement: Statement
    signature: bytes

    def envelope(self) -> bytes:
        """Its DSSE envelope, canonical JSON bytes: exactly what the signature covers
        (the canonical payload), so a copy of it (the client's receipt) holds nothing
        unsigned, whatever else the envelope it was read from carried."""
        return canonical_json_of_plain(
            {
                "payloadType": ATTESTATION_PAYLOAD_TYPE,
                "payload": base64.b64encode(self.statement.payload()).decode(),
                "signatures": [
                    {"keyid": self.statement.key, "sig": base64.b64encode(self.signature).decode()}
                ],
            }
        )


def sign_statement(statement: Statement, signer: Signer) -> bytes:
    """The DSSE envelope (canonical JSON bytes) of `statement`, signed by `signer`."""
    if statement.key != str(signer):
        raise ValueError("the statement must name the key that signs it")
    signature = signer.sign(pae(ATTESTATION_PAYLOAD_TYPE, statement.payload()))
    return Countersignature(statement, signature).envelope()


def _b64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedError(f"countersignature {what} is not a string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise MalformedError(f"countersignature {what} is not valid base64") from exc


def open_countersignature(envelope: bytes) -> Countersignature:
    """Parse an envelope without verifying it (MalformedError if it is not one)."""
    if len(envelope) > MAX_ENVELOPE:
        raise MalformedError(f"countersignature is longer than {MAX_ENVELOPE} bytes")
    # Strict: a member twice (read differently by other parsers), nesting past the
    # recursion limit or a number past the digit limit is malformed, never an exception.
    value = loads_strict(envelope, "countersignature")
    if not isinstance(value, dict) or value.get("payloadType") != ATTESTATION_PAYLOAD_TYPE:
        raise MalformedError("not a DSSE envelope of " + ATTESTATION_PAYLOAD_TYPE)
    signatures = value.get("signatures")
    if not isinstance(signatures, list) or len(signatures) != 1:
        raise MalformedError("a countersignature carries exactly one signature")
    item = signatures[0]
    if not isinstance(item, dict):
        raise MalformedError("countersignature signature is not an object")
    record = loads_strict(_b64(value.get("payload"), "payload"), "countersignature payload")
    if not isinstance(record, dict):
        raise MalformedError("countersignature payload is not an object")
    statement = Statement.from_record(record)
    if item.get("keyid") != statement.key:
        raise MalformedError("countersignature keyid differs from the statement's key")
    return Countersignature(statement, _b64(item.get("sig"), "signature"))


class AttestationFailure(Exception):
    """A countersignature the gateway cannot accept; `code` is one of FAILURES."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_countersignature(
    envelope: bytes | None,
    verifier: Verifier,
    *,
    request_id: str,
    request_commitment: str,
    response_commitment: str,
) -> Countersignature:
    """The countersignature of this exchange, verified: signed by `verifier`'s key over
    exactly this request id and these two commitments. Raises AttestationFailure."""
    if envelope is None:
        raise AttestationFailure("missing", "the backend sent no countersignature")
    try:
        counter = open_countersignature(envelope)
    except MalformedError as exc:
        raise AttestationFailure("malformed", str(exc)) from exc
    statement = counter.statement
    if statement.key != str(verifier):
        raise AttestationFailure(
            "wrong_key", f"countersigned by {statement.key}, expected {verifier}"
        )
    try:
        verifier.verify(pae(ATTESTATION_PAYLOAD_TYPE, statement.payload()), counter.signature)
    except SignatureError as exc:
        raise AttestationFailure("bad_signature", str(exc)) from exc
    for name, ours, theirs in (
        ("request id", request_id, statement.request_id),
        ("request commitment", request_commitment, statement.request_commitment),
        ("response commitment", response_commitment, statement.response_commitment),
    ):
        if ours != theirs:
            raise AttestationFailure("mismatch", f"the countersigned {name} differs")
    return counter


@dataclass(frozen=True, slots=True)
class Attestation:
    """The completion record's `attestation` field: a verified countersignature
    (`failure` None), or the key expected and why nothing was accepted (`sig` None)."""

    key: str
    counter: int | None = None
    time: str | None = None
    sig: str | None = None  # base64 Ed25519 signature
    failure: str | None = None

    def __post_init__(self) -> None:
        if type(self.key) is not str or not self.key:
            raise RecordError("attestation key must be a non-empty string")
        signed = (self.counter, self.time, self.sig)
        if self.failure is None:
            if any(item is None for item in signed):
                raise RecordError("an accepted attestation has counter, time and sig")
        elif self.failure not in FAILURES or any(item is not None for item in signed):
            raise RecordError(f"attestation failure must be one of {sorted(FAILURES)}, alone")

    @classmethod
    def accepted(cls, counter: Countersignature) -> Attestation:
        s = counter.statement
        return cls(s.key, s.counter, s.time, base64.b64encode(counter.signature).decode())

    def field(self) -> dict[str, object]:
        return {
            "key": self.key,
            "counter": self.counter,
            "time": self.time,
            "sig": self.sig,
            "failure": self.failure,
        }


def statement_of_records(
    dispatch: Mapping[str, Any], completion: Mapping[str, Any]
) -> tuple[Statement, bytes] | None:
    """The statement a completion record's accepted attestation claims, rebuilt from the
    two records, and its signature (None when the record holds no accepted one)."""
    field = completion.get("attestation")
    if not isinstance(field, dict) or field.get("sig") is None:
        return None
    response = completion.get("response_commitment")
    if response is None:
        raise MalformedError("an attested completion has no response commitment")
    try:
        statement = Statement(
            completion["request_id"],
            field["time"],
            field["counter"],
            field["key"],
            dispatch["request_commitment"],
            response,
        )
    except RecordError as exc:
        raise MalformedError(str(exc)) from exc
    return statement, _b64(field["sig"], "signature")


def one_key_per_backend(backend_keys: Mapping[str, Verifier]) -> None:
    """Raise ValueError when two backends are given one key (the same key id): a statement
    names its key, not its backend, so with one key for A and B a log could say B served
    what A's sidecar countersigned (and their counters would collide). Each sidecar needs
    its own key."""
    seen: dict[str, tuple[str, bytes]] = {}
    for backend, verifier in backend_keys.items():
        earlier, public = seen.setdefault(str(verifier), (backend, verifier.public_key))
        if earlier == backend:
            continue
        if public == verifier.public_key:
            raise ValueError(
                f"backends {earlier} and {backend} are given one key ({verifier}): a "
                "countersignature could not tell them apart; give each sidecar its own key"
            )
        raise ValueError(
            f"backends {earlier} and {backend} are given different keys with one key id "
            f"({verifier}): a countersignature names its key by that id and could not tell "
            "them apart; give one of the sidecars a new key"
        )


def receipt_countersignature(
    envelope: bytes, receipt: Receipt, backend_keys: Mapping[str, Verifier]
) -> Statement | None:
    """The backend's statement a (verified) receipt carries, checked: signed by the key
    given for the receipt's backend, for the receipt's request. None when no key is given
    for that backend; SignatureError when one is and the countersignature is absent or
    does not verify. Its response commitment opens with the receipt's response salt."""
    verifier = backend_keys.get(receipt.backend)
    if verifier is None:
        return None
    found = countersignature_of(envelope)
    if found is None:
        raise SignatureError(
            f"backend {receipt.backend} is attested, but the receipt carries no countersignature"
        )
    counter = open_countersignature(found)
    if found != counter.envelope():
        # The gateway writes exactly this envelope; anything else around the signature
        # (another member, a non-canonical payload or base64) is unsigned, added later.
        raise MalformedError(
            "the receipt's countersignature is not the envelope the gateway writes: it "
            "holds members or encodings the backend's signature does not cover"
        )
    statement = counter.statement
    if statement.key != str(verifier):
        raise SignatureError(
            f"the receipt's countersignature is by {statement.key}, not by backend "
            f"{receipt.backend}'s key {verifier}"
        )
    verifier.verify(pae(ATTESTATION_PAYLOAD_TYPE, statement.payload()), counter.signature)
    if statement.request_id != receipt.request_id:
        raise SignatureError(
            f"the countersignature is for request {statement.request_id!r}, not "
            f"{receipt.request_id!r}"
        )
    return statement
