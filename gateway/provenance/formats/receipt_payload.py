"""A receipt's payload: what the log's signature binds, in either receipt form.

`Receipt.payload()` is the JCS object of `application/vnd.owngate.receipt+json`: the log,
the dispatch (or refusal) record's leaf index and hash, the backend, the policy digest and
the two commitment salts. A per-request receipt (`receipts`) signs it directly; a batch
receipt (`receipt_batch`) signs the Merkle root of a batch of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.commitments import Salts

__all__ = ["MAX_ORIGIN", "RECEIPT_PAYLOAD_TYPE", "REQUEST_ID", "Receipt", "plain_origin"]

RECEIPT_PAYLOAD_TYPE = "application/vnd.owngate.receipt+json"
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")  # a SHA-256 hash or a 32-byte salt

# A request id: the gateway's `req_` (a request) or `adm_` (an admin action) and 24 hex
# digits, a sidecar's own `attest-` and 16; the form a sidecar accepts of x-request-id.
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
# A receipt's backend: a backend id as gateway.yaml allows it, or "" for a refusal.
_BACKEND = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,62})?\Z")


def _is_one(value: object) -> bool:
    """The version 1: the JSON integer, not `true` or `1.0`."""
    return type(value) is int and value == 1


MAX_ORIGIN = 255  # characters of a log's origin line


def plain_origin(origin: str) -> bool:
    """A log origin as owngate writes and reads one: 1..`MAX_ORIGIN` printable characters
    (`str.isprintable`: no control or format character, no line separator, no space but
    the ASCII one), so that what names a log cannot drive the terminal that shows it."""
    return 0 < len(origin) <= MAX_ORIGIN and origin.isprintable()


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
        # `type(...) is int`: `true` and `1.0` equal 1 in Python, and a verifier reading
        # `v` as an integer refuses them (one receipt, two verdicts otherwise).
        if not isinstance(value, dict) or set(value) != expected or not _is_one(value["v"]):
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
        # Shown to an auditor and matched against the log: each in its documented form,
        # not quoted here (what does not verify is not to be printed).
        if not REQUEST_ID.match(value["request_id"]):
            raise MalformedError("receipt request_id is not 1-128 of A-Za-z0-9._:-")
        if not plain_origin(value["log"]):
            raise MalformedError(
                f"receipt log is not an origin of 1-{MAX_ORIGIN} printable characters"
            )
        if not _BACKEND.match(value["backend"]):
            raise MalformedError("receipt backend is not a backend id (or empty: a refusal)")
        return cls(
            request_id=value["request_id"],
            log=value["log"],
            index=value["index"],
            dispatch_hash=bytes.fromhex(value["dispatch_hash"]),
            backend=value["backend"],
            policy_digest=value["policy_digest"],
            salts=Salts(bytes.fromhex(salts["request"]), bytes.fromhex(salts["response"])),
        )
