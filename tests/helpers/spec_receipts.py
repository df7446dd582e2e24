"""The proofs and receipts half of the from-the-spec verifier (tests/helpers/spec_verifier.py):
C2SP tlog-proof and tlog-cosignature, owngate's records (RFC 8785) and receipts, the
receipt checked by docs/provenance.md's own recipe as written and then tied to the log
and to the bytes the client sent and received. Standard library and `cryptography` only.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.helpers.spec_tiles import Tree
from tests.helpers.spec_verifier import (
    HASH,
    Checkpoint,
    Key,
    SpecError,
    b64,
    check,
    inclusion_proof,
    leaf_hash,
    parse_checkpoint,
    split_note,
    verify_inclusion,
)

# --- tlog-proof and tlog-cosignature ---------------------------------------------------


def verify_tlog_proof(
    data: bytes, keys: list[Key], origin: str, leaf: bytes | None = None
) -> tuple[int, bytes | None, Checkpoint]:
    """A c2sp.org/tlog-proof@v1; `leaf` the leaf hash when the proof has no extra line.
    Returns (index, extra, checkpoint)."""
    text = data.decode("utf-8")
    head, sep, note = text.partition("\n\n")
    check(sep == "\n\n", "tlog-proof: the proof lines, an empty line, the checkpoint")
    lines = head.split("\n")
    check(lines[0] == "c2sp.org/tlog-proof@v1", "tlog-proof: first line c2sp.org/tlog-proof@v1")
    extra = None
    rest = lines[1:]
    if rest and rest[0].startswith("extra "):
        extra = b64(rest[0][len("extra ") :])
        rest = rest[1:]
    match = re.fullmatch(r"index (0|[1-9][0-9]*)", rest[0] if rest else "")
    check(match is not None, "tlog-proof: 'index N', decimal, no leading zeroes")
    assert match is not None
    path = [b64(line) for line in rest[1:]]
    check(all(len(p) == HASH for p in path), "tlog-proof: one SHA-256 hash per line")
    checkpoint = parse_checkpoint(note.encode(), keys, origin)
    if leaf is None:
        check(extra is not None, "tlog-proof: no leaf hash to prove")
        assert extra is not None
        leaf = leaf_hash(extra)
    verify_inclusion(leaf, int(match[1]), checkpoint.size, path, checkpoint.root)
    return int(match[1]), extra, checkpoint


def verify_cosignature(note_bytes: bytes, witness: Key) -> int:
    """The witness's cosignature/v1 line on a checkpoint note; its timestamp."""
    check(witness.kind == 0x04, "tlog-cosignature: an Ed25519 cosigner key is type 0x04")
    note = split_note(note_bytes)
    mine = [s for n, s in note.lines if n == witness.name and s[:4] == witness.key_id]
    check(len(mine) == 1, "tlog-cosignature: one line by the witness")
    blob = mine[0]
    check(len(blob) == 4 + 8 + 64, "tlog-cosignature: key id || u64 timestamp || signature")
    timestamp = int.from_bytes(blob[4:12], "big")
    check(timestamp <= 2**63 - 1, "tlog-cosignature: timestamp MUST NOT exceed 2^63 - 1")
    message = b"cosignature/v1\ntime %d\n" % timestamp + note.text
    try:
        Ed25519PublicKey.from_public_bytes(witness.public).verify(blob[12:], message)
    except InvalidSignature:
        raise SpecError("tlog-cosignature: the cosignature does not verify") from None
    return timestamp


def canonical_record(entry: bytes) -> dict[str, object]:
    """owngate's docs: each entry is its record's RFC 8785 encoding (here: ASCII member
    names and integers, which JCS orders and writes as `sort_keys` does)."""

    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        check(len(dict(pairs)) == len(pairs), "RFC 8785: a member written twice")
        return dict(pairs)

    record = json.loads(entry, object_pairs_hook=unique)
    again = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    check(again.encode() == entry, "docs: a record is its own canonical (JCS) encoding")
    return dict(record)


RECEIPT_LINE = re.compile(rb"(?:\A|(?<=[\r\n])): owngate-receipt ([A-Za-z0-9+/]*={0,2})\n\n\Z")


def stream_receipt(received: bytes) -> tuple[bytes, bytes]:
    """(the backend's bytes, the receipt) of a stream that ended normally: the gateway's
    receipt line is last, starting a line of its own (docs: the body a client commits
    to)."""
    found = RECEIPT_LINE.search(received)
    check(found is not None, "docs: a stream's last line is ': owngate-receipt <base64>'")
    assert found is not None
    return received[: found.start()], b64(found[1].decode())


ERROR_EVENT = re.compile(rb'data: \{"error":\{[^\r\n]*\}\}\n\n\Z')


def stream_bodies(received: bytes) -> tuple[list[bytes], bytes]:
    """(the bodies a stream's commitment may be to, the receipt), as docs/provenance.md
    ("The body a client commits to") lists them: the bytes before the receipt line, less
    the line end the gateway wrote before it, or less its error event and what it wrote
    to end the backend's unfinished event (nothing, LF, or LF LF)."""
    body, receipt = stream_receipt(received)
    bodies = [body]
    if body.endswith(b"\n") and body[:-1] and body[-2:-1] not in (b"\n", b"\r"):
        bodies.append(body[:-1])
    event = ERROR_EVENT.search(body)
    if event and body[event.start() - 1 : event.start()] in (b"", b"\n", b"\r"):
        before = body[: event.start()]
        bodies += [before[: len(before) - n] for n in (0, 1, 2) if before.endswith(b"\n" * n)]
    return bodies, receipt


def _recipe(call: object, *args: object) -> object:
    try:
        return call(*args)  # type: ignore[operator]
    except (AssertionError, KeyError, TypeError, ValueError, InvalidSignature) as error:
        raise SpecError(f"docs' receipt recipe refuses it: {error!r}") from None


def verify_client_receipt(
    receipt: bytes,
    *,
    vkey: str,
    request_id: str,
    sent: bytes,
    body: bytes | list[bytes] | None,
    tree: Tree,
    recipes: dict[str, Any],
    backend_vkeys: dict[str, str] | None = None,
    received: bytes | None = None,
) -> dict[str, Any]:
    """A client's receipt, checked as the docs say an independent client checks it: the
    recipe (v1 or v2), the request id is the answer's `x-request-id`, and then against the
    log: the entry at `index` is the record it names (leaf hash, request id, backend,
    policy digest), included under the checkpoint, its request commitment opening with
    the bytes `sent`, and the completion linking to it with the `body` the client got
    (a stream less the gateway's receipt line; a list: the candidates one of which it is;
    None: the client got only the gateway's own error, a commitment to nothing relayed,
    null). `received`: the bytes as received, for the countersignature recipe."""
    claims = _recipe(recipes["verify_receipt"], receipt, vkey)
    assert isinstance(claims, dict)
    check(claims["request_id"] == request_id, "docs: the receipt's request_id is x-request-id")
    check(claims["log"] == tree.checkpoint.origin, "docs: the receipt names this log")
    index = claims["index"]
    check(index < tree.checkpoint.size, "docs: a checkpoint covers the receipt's index")
    entry = tree.entries[index]
    check(leaf_hash(entry).hex() == claims["dispatch_hash"], "docs: dispatch_hash is the leaf")
    verify_inclusion(
        leaf_hash(entry),
        index,
        tree.checkpoint.size,
        inclusion_proof(index, tree.hashes),
        tree.checkpoint.root,
    )
    record = canonical_record(entry)
    check(record["request_id"] == request_id, "docs: the entry is the request's")
    backend = record.get("backend")
    if claims["backend"] == "":
        check(record["type"] == "refusal", "docs: a receipt naming no backend is a refusal's")
    else:
        check(record["type"] == "dispatch", "docs: the receipt names a dispatch")
        check(isinstance(backend, dict) and backend["id"] == claims["backend"], "docs: backend")
    policy = record["policy"]
    check(isinstance(policy, dict) and policy["digest"] == claims["policy_digest"], "policy")
    commit = recipes["commitment"]
    salts = claims["salts"]
    check(
        record["request_commitment"] == commit("request", salts["request"], sent),
        "docs: the request commitment opens with the bytes the client sent",
    )
    if record["type"] == "dispatch":
        link = {"index": index, "hash": claims["dispatch_hash"]}
        done = [
            r
            for r in map(canonical_record, tree.entries[index + 1 :])
            if r["type"] == "completion" and r["dispatch"] == link
        ]
        check(len(done) == 1, "docs: one completion links to the dispatch")
        candidates = [body] if isinstance(body, bytes) else body
        opened = [commit("response", salts["response"], b) for b in candidates or []]
        committed = done[0]["response_commitment"]
        check(
            committed in opened if body is not None else committed is None,
            "docs: the response commitment opens with the body the client received",
        )
    if backend_vkeys is not None and received is not None:
        _recipe(
            recipes["verify_countersignature"],
            receipt,
            vkey,
            backend_vkeys,
            sent,
            received,
        )
    return claims
