"""DSSE v1 envelopes as receipts use them: PAE, strict parsing, signature checks.

Shared by the per-request receipt (`receipts`) and the batch receipt (`receipt_batch`).
Parsing is strict where a lenient parser would let two verifiers disagree on what was
signed: a JSON object with a duplicated member name is refused (parsers differ on which
one wins), and base64 must be the canonical encoding of the bytes it decodes to (the
unused low bits of the last character zero), so no two strings carry the same bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterable, Sequence

from gateway.canonical import canonical_json
from gateway.provenance.errors import MalformedError, SignatureError
from gateway.provenance.formats.note import Signer, Verifier

__all__ = [
    "MAX_SIGNATURES",
    "canonical_payload",
    "decode_base64",
    "loads_strict",
    "pae",
    "signed_envelope",
    "sole_members",
    "verify_signatures",
]

# An envelope carries the gateway's signature (and one per earlier key at most, after a
# rotation); anything far beyond that is an attempt to make verification expensive.
MAX_SIGNATURES = 8


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise MalformedError("receipt JSON has a duplicated member name")
    return value


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is no JSON value (RFC 8259)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # `1e400`: Python's inf, JavaScript's Infinity, Go's error
        raise ValueError("a number past a double's range")
    return value


def _integer(text: str) -> int:
    if not math.isfinite(float(text)):  # 309 digits or more: a double's inf, as above
        raise ValueError("a number past a double's range")
    return int(text)


def loads_strict(data: bytes, what: str) -> object:
    """JSON text as RFC 8259 has it, refusing duplicated member names (MalformedError for
    anything not JSON): UTF-8 with no byte order mark, no `NaN` or `Infinity`, no number
    past a double's range. Python's `json.loads` takes all of these (UTF-16 and UTF-32
    told by their zero bytes, surrogates encoded in UTF-8), which other parsers refuse or
    read otherwise: one receipt would get two verdicts."""
    try:
        text = data.decode("utf-8")  # strict: no encoded surrogate; a BOM stays, refused
        return json.loads(
            text,
            object_pairs_hook=_unique,
            parse_constant=_no_constant,
            parse_float=_finite,
            parse_int=_integer,
        )
    # ValueError: also a number over Python's 4,300-digit limit; RecursionError: nested deep
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        raise MalformedError(f"{what} is not JSON: {str(exc)[:200]}") from exc


def decode_base64(value: object, what: str) -> bytes:
    """Standard, padded base64 in its one canonical spelling."""
    if not isinstance(value, str):
        raise MalformedError(f"receipt {what} is not a string")
    try:
        decoded = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise MalformedError(f"receipt {what} is not valid base64") from exc
    if base64.b64encode(decoded).decode("ascii") != value:
        raise MalformedError(f"receipt {what} is not canonical base64")
    return decoded


def signed_envelope(payload_type: str, payload: bytes, signer: Signer) -> dict[str, object]:
    """The DSSE envelope (as a dict, for the caller to encode) of `payload`."""
    signature = signer.sign(pae(payload_type, payload))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": str(signer), "sig": base64.b64encode(signature).decode()}],
    }


def verify_signatures(
    payload_type: str, payload: bytes, signatures: object, verifiers: Iterable[Verifier]
) -> None:
    """Raise unless a trusted key signed PAE(`payload_type`, `payload`). A signature counts
    only where its `keyid` names the trusted key (`name+hexid`) that made it, and each one
    naming a trusted key must verify; the others are not read (a `keyid` is DSSE's hint,
    which owngate always writes, so what is checked never depends on guessing). The list
    holds 1 to MAX_SIGNATURES objects. docs/provenance.md's recipe checks the same."""
    if not isinstance(signatures, list) or not signatures:
        raise MalformedError("receipt envelope has no signatures")
    if len(signatures) > MAX_SIGNATURES:  # refused unread
        raise MalformedError(f"receipt envelope has over {MAX_SIGNATURES} signatures")
    items = [item for item in signatures if isinstance(item, dict)]
    if len(items) != len(signatures):
        raise MalformedError("receipt signature is not an object")
    message = pae(payload_type, payload)
    trusted = list(verifiers)
    verified = False
    for item in items:
        named = [v for v in trusted if str(v) == item.get("keyid")]
        if named:
            named[0].verify(message, decode_base64(item.get("sig"), "signature"))  # or raises
            verified = True
    if not verified:
        keys = ", ".join(str(v) for v in trusted) or "none"
        raise SignatureError(f"receipt is not signed by a trusted key (trusted: {keys})")


def canonical_payload(payload: bytes, what: str) -> object:
    """The JSON value of a payload that must be its own JCS encoding."""
    value = loads_strict(payload, what)
    try:
        canonical = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise MalformedError(f"{what} cannot be canonicalised: {exc}") from exc
    if canonical != payload:
        raise MalformedError(f"{what} is not canonical JSON (RFC 8785)")
    return value


def sole_members(value: object, required: Sequence[str], what: str) -> dict[str, object]:
    """`value` as an object with exactly the members `required`."""
    if not isinstance(value, dict) or set(value) != set(required):
        raise MalformedError(f"{what} must have exactly the members {sorted(required)}")
    return value
