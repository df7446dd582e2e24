"""Batch receipts (v2): one Ed25519 signature per committed batch of the log.

The log signs one *batch statement* per committed batch: a DSSE envelope of type
`application/vnd.owngate.receipt-batch+json` whose payload is the JCS object

    {"entries", "first", "log", "receipts", "root", "v": 1}

`root` is the RFC 6962 Merkle tree hash (MTH) of the batch's receipt payloads in log
order, each leaf SHA-256(0x00 || JCS payload), the very payload a v1 receipt signs (so
every claim of a receipt stays bound by the signature); `receipts` is the number of
leaves; every payload names a log index in [first, first + entries). Each receipt is

    {"batch": <the statement's envelope>, "path": [<base64 hash>, ...],
     "payload": <base64 JCS payload>, "payloadType": "application/vnd.owngate.receipt+json",
     "position": <leaf position>}

in JCS, optionally with the `attestation` member of an attested backend. Verifying one
needs only the log's public key: the leaf hash climbs the path to the root (RFC 6962
inclusion at `position` in a tree of `receipts` leaves), the root is the signed one, the
payload's log is the statement's, its index within the statement's range, the signature
valid. A batch holds at most MAX_BATCH_RECEIPTS receipts (a larger one is signed in
parts), so a path has at most MAX_PATH hashes; longer ones are refused unread.
"""

from __future__ import annotations

import binascii
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.canonical import canonical_json_of_plain, canonical_part
from gateway.provenance.errors import MalformedError, ProofError
from gateway.provenance.formats.dsse import (
    canonical_payload,
    decode_base64,
    signed_envelope,
    sole_members,
    verify_signatures,
)
from gateway.provenance.formats.merkle import (
    leaf_hash,
    node_hash,
    verify_inclusion,
)
from gateway.provenance.formats.note import Signer, Verifier
from gateway.provenance.formats.receipt_payload import RECEIPT_PAYLOAD_TYPE, Receipt

__all__ = [
    "BATCH_PAYLOAD_TYPE",
    "MAX_BATCH_RECEIPTS",
    "MAX_PATH",
    "BatchStatement",
    "is_batch_receipt",
    "seal_receipts",
    "verify_batch_receipt",
]

BATCH_PAYLOAD_TYPE = "application/vnd.owngate.receipt-batch+json"
MAX_BATCH_RECEIPTS = 1024  # the log's largest batch (LogSettings.max_batch)
MAX_PATH = (MAX_BATCH_RECEIPTS - 1).bit_length()  # 10: an audit path's longest
_MEMBERS = frozenset({"batch", "path", "payload", "payloadType", "position"})
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class BatchStatement:
    """What the log signs once per batch."""

    log: str  # the log's checkpoint origin
    first: int  # the log index of the batch's first receipt
    entries: int  # every receipt names an index in [first, first + entries)
    receipts: int  # leaves of the tree
    root: bytes  # MTH of the receipt payloads' leaf hashes, in log order

    def payload(self) -> dict[str, object]:
        return {
            "v": 1,
            "log": self.log,
            "first": self.first,
            "entries": self.entries,
            "receipts": self.receipts,
            "root": self.root.hex(),
        }

    @classmethod
    def from_payload(cls, value: object) -> BatchStatement:
        names = ("v", "log", "first", "entries", "receipts", "root")
        found = sole_members(value, names, "batch statement")
        if (
            type(found["v"]) is not int  # `true` equals 1 in Python, and is JCS too
            or found["v"] != 1
            or not isinstance(found["log"], str)
            or not all(_count(found[name]) for name in ("first", "entries", "receipts"))
            or not isinstance(found["root"], str)
            or not _HEX64.match(found["root"])
        ):
            raise MalformedError("batch statement has a field of the wrong type")
        first, entries, receipts = found["first"], found["entries"], found["receipts"]
        assert isinstance(first, int) and isinstance(entries, int)  # for mypy: _count
        assert isinstance(receipts, int)
        if not 1 <= receipts <= min(entries, MAX_BATCH_RECEIPTS):
            raise MalformedError(
                f"batch statement of {receipts} receipts over {entries} entries (at most "
                f"{MAX_BATCH_RECEIPTS} receipts, no more than entries)"
            )
        return cls(str(found["log"]), first, entries, receipts, bytes.fromhex(str(found["root"])))


def _mth_paths(leaves: Sequence[bytes], begin: int, end: int, paths: list[list[bytes]]) -> bytes:
    """MTH(leaves[begin:end]) (RFC 6962 section 2.1); appends to `paths[i]`, for each leaf
    `i` of the range, the sibling hashes met on the way up (its audit path, leaf side
    first: a subtree is finished, and its leaves' siblings below appended, before its
    parent appends). Each node of the tree is hashed once, not once per path through it."""
    if end - begin == 1:
        return leaves[begin]
    middle = begin + (1 << ((end - begin - 1).bit_length() - 1))  # RFC 6962's split
    left = _mth_paths(leaves, begin, middle, paths)
    right = _mth_paths(leaves, middle, end, paths)
    for path in paths[begin:middle]:
        path.append(right)
    for path in paths[middle:end]:
        path.append(left)
    return node_hash(left, right)


def seal_receipts(
    payloads: Sequence[tuple[int, bytes]], log: str, signer: Signer, *, lone_v1: bool = False
) -> list[bytes]:
    """The v2 receipts (JCS bytes) of one committed batch: `payloads` holds each receipt's
    (log index, JCS payload), in log order. One signature per MAX_BATCH_RECEIPTS.
    `lone_v1`: a receipt alone in its batch is signed as a v1 receipt instead, the same
    one signature over the same payload, without the statement and path a batch of one
    would add (~0.3 KB, and some 5-10 µs of sealing per request)."""
    if lone_v1 and len(payloads) == 1:
        envelope = signed_envelope(RECEIPT_PAYLOAD_TYPE, payloads[0][1], signer)
        return [canonical_json_of_plain(envelope)]
    receipts: list[bytes] = []
    for start in range(0, len(payloads), MAX_BATCH_RECEIPTS):
        receipts.extend(_seal_part(payloads[start : start + MAX_BATCH_RECEIPTS], log, signer))
    return receipts


def _seal_part(payloads: Sequence[tuple[int, bytes]], log: str, signer: Signer) -> list[bytes]:
    indices = [index for index, _ in payloads]
    if any(a >= b for a, b in itertools.pairwise(indices)):
        raise ValueError("a batch's receipts must name increasing log indices")
    size = len(payloads)
    paths: list[list[bytes]] = [[] for _ in range(size)]
    root = _mth_paths([leaf_hash(payload) for _, payload in payloads], 0, size, paths)
    statement = BatchStatement(log, indices[0], indices[-1] - indices[0] + 1, size, root)
    batch = signed_envelope(
        BATCH_PAYLOAD_TYPE, canonical_json_of_plain(statement.payload()), signer
    )
    batch_part = canonical_part(batch)  # encoded once, not once per receipt
    b64 = binascii.b2a_base64  # `base64.b64encode`'s own call, without its Python frame
    return [
        canonical_json_of_plain(
            {
                "batch": batch_part,
                "path": [b64(node, newline=False).decode() for node in path],
                "payload": b64(payload, newline=False).decode(),
                "payloadType": RECEIPT_PAYLOAD_TYPE,
                "position": position,
            }
        )
        for position, ((_, payload), path) in enumerate(zip(payloads, paths, strict=True))
    ]


def is_batch_receipt(value: dict[str, object]) -> bool:
    """Whether a parsed receipt envelope is in the batch form (v2)."""
    return "batch" in value


def verify_batch_receipt(value: dict[str, object], verifiers: Iterable[Verifier]) -> Receipt:
    """Check a v2 receipt (`value`, parsed without duplicated member names). What is signed
    or hashed (the payload, the statement) must be JCS and canonical base64, and the
    signature's `keyid` must name the trusted key that made it; the receipt's own JSON may
    be re-encoded (pretty-printed, members reordered): it is checked member by member."""
    if set(value) - {"attestation"} != _MEMBERS:
        raise MalformedError(f"batch receipt must have exactly the members {sorted(_MEMBERS)}")
    path, position = value["path"], value["position"]
    if not isinstance(path, list) or len(path) > MAX_PATH:  # refused before reading it
        raise MalformedError(f"batch receipt path is not a list of at most {MAX_PATH} hashes")
    if (
        not isinstance(position, int)
        or isinstance(position, bool)
        or not 0 <= position < MAX_BATCH_RECEIPTS
    ):
        raise MalformedError("batch receipt position is not a leaf position")
    batch = sole_members(value["batch"], ("payload", "payloadType", "signatures"), "batch")
    if batch["payloadType"] != BATCH_PAYLOAD_TYPE:
        raise MalformedError(
            f"batch receipt's batch is not a DSSE envelope of {BATCH_PAYLOAD_TYPE}"
        )
    signed = decode_base64(batch["payload"], "batch payload")
    statement = BatchStatement.from_payload(canonical_payload(signed, "batch statement"))
    payload = decode_base64(value["payload"], "payload")
    receipt = Receipt.from_payload(canonical_payload(payload, "receipt payload"))
    if receipt.log != statement.log:
        raise ProofError(f"the batch is of log {statement.log!r}, the receipt of {receipt.log!r}")
    if not statement.first <= receipt.index < statement.first + statement.entries:
        raise ProofError(
            f"the receipt's index {receipt.index} is outside its batch, entries "
            f"[{statement.first}, {statement.first + statement.entries})"
        )
    hashes = [decode_base64(item, f"path hash {n}") for n, item in enumerate(path)]
    verify_inclusion(leaf_hash(payload), position, statement.receipts, hashes, statement.root)
    verify_signatures(BATCH_PAYLOAD_TYPE, signed, batch["signatures"], verifiers)
    return receipt
