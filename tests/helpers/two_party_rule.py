"""The layer-3 audit rule of docs/provenance.md ("The audit"), written from that page
alone with the standard library and `cryptography`: no owngate code, so a test can hold
`owngate audit verify --backend-key ID=VKEY --attest-log ID=DIR` to what the docs promise.
The logs' entries come from the independent C2SP reader (tests/helpers/c2sp_verifier.py).

For every completion whose dispatch names backend ID: an answer (status below 400) needs
an accepted countersignature (`attestation` with `failure` null), and any accepted one,
whatever the status, must verify with ID's key over the statement rebuilt from the
records (request id, the dispatch's request commitment, the completion's response
commitment, the attestation's counter, time and key), no counter used twice. Against the
sidecar's log: statements in increasing counter order, each carried statement identical
to the sidecar's entry of its counter, and each sidecar statement not carried either for
a request dispatched to ID over the same body (counted) or a failure (bypass).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["Verdict", "two_party_verdict"]

PAYLOAD_TYPE = b"application/vnd.owngate.attestation+json"


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    carried: int = 0  # accepted countersignatures the gateway's log holds for ID
    uncarried: int = 0  # sidecar statements for ID's dispatches with none accepted

    @property
    def ok(self) -> bool:
        return not self.problems


def _key(vkey: str) -> tuple[str, Ed25519PublicKey]:
    """`name+hexid` and the public key of a signed-note verifier key."""
    name, hexid, encoded = vkey.split("+", 2)
    raw = base64.b64decode(encoded, validate=True)
    assert len(raw) == 33 and raw[0] == 1, "not an Ed25519 verifier key"
    assert hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4].hex() == hexid
    return f"{name}+{hexid}", Ed25519PublicKey.from_public_bytes(raw[1:])


def _jcs(value: dict[str, Any]) -> bytes:
    """RFC 8785 for a statement (ASCII strings and integers only)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _pae(payload: bytes) -> bytes:
    return b"DSSEv1 %d %s %d %s" % (len(PAYLOAD_TYPE), PAYLOAD_TYPE, len(payload), payload)


def two_party_verdict(
    gateway_entries: list[bytes], sidecar_entries: list[bytes], backend_id: str, vkey: str
) -> Verdict:
    """The docs' verdict on backend `backend_id` (sidecar key `vkey`) for the two logs'
    entries (canonical JSON records, in log order)."""
    key_id, public = _key(vkey)
    verdict = Verdict()
    records = [json.loads(entry) for entry in gateway_entries]
    dispatched: set[tuple[str, str]] = set()  # (request id, request commitment) sent to ID
    carried: dict[int, bytes] = {}
    for index, record in enumerate(records):
        if record["type"] == "dispatch" and record["backend"]["id"] == backend_id:
            dispatched.add((record["request_id"], record["request_commitment"]))
        if record["type"] != "completion":
            continue
        link = record["dispatch"]
        dispatch = records[link["index"]]
        leaf = hashlib.sha256(b"\x00" + gateway_entries[link["index"]]).hexdigest()
        if dispatch["type"] != "dispatch" or leaf != link["hash"]:
            verdict.problems.append(f"entry {index}: links to no dispatch")
            continue
        if dispatch["backend"]["id"] != backend_id:
            continue
        status, attestation = record["status"], record.get("attestation")
        if not 200 <= status <= 599:  # "HTTP status of this attempt's answer to the client"
            verdict.problems.append(f"entry {index}: status {status} is no answer's")
            continue
        accepted = attestation is not None and attestation["failure"] is None
        if not accepted:
            if status < 400:
                verdict.problems.append(f"entry {index}: an answer with no countersignature")
            continue
        if attestation["key"] != key_id or record["response_commitment"] is None:
            verdict.problems.append(f"entry {index}: not countersigned by {key_id}")
            continue
        payload = _jcs(
            {
                "v": 1,
                "type": "attestation",
                "request_id": record["request_id"],
                "time": attestation["time"],
                "counter": attestation["counter"],
                "key": attestation["key"],
                "request_commitment": dispatch["request_commitment"],
                "response_commitment": record["response_commitment"],
            }
        )
        try:
            public.verify(base64.b64decode(attestation["sig"], validate=True), _pae(payload))
        except InvalidSignature:
            verdict.problems.append(f"entry {index}: the countersignature does not verify")
            continue
        if attestation["counter"] in carried:
            verdict.problems.append(f"entry {index}: counter {attestation['counter']} replayed")
            continue
        carried[attestation["counter"]] = payload
    verdict.carried = len(carried)
    statements = [json.loads(entry) for entry in sidecar_entries]
    counters = [statement["counter"] for statement in statements]
    if counters != sorted(set(counters)):
        verdict.problems.append("the sidecar's statements are not in increasing counter order")
    logged = dict(zip(counters, sidecar_entries, strict=True))
    for counter, payload in carried.items():
        if logged.get(counter) != payload:
            verdict.problems.append(f"counter {counter}: not the sidecar's statement")
    for statement in statements:
        if statement["counter"] in carried:
            continue
        if (statement["request_id"], statement["request_commitment"]) in dispatched:
            verdict.uncarried += 1
        else:
            verdict.problems.append(f"counter {statement['counter']}: bypassed the gateway")
    return verdict
