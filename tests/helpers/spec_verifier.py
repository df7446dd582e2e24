"""A strict auditor's verifier written from the specification texts alone (C2SP
signed-note, tlog-checkpoint, tlog-tiles, tlog-proof, tlog-cosignature; RFC 6962 /
RFC 9162 Merkle trees) and owngate's public docs (docs/provenance.md, its receipt
recipe, docs/admin-api.md). It imports nothing of `gateway` and was written without
reading it: standard library and `cryptography` only. Every check raises `SpecError`
naming the rule it enforces; nothing returns a bool.

Stricter than the specs where owngate's own output must be so (each marked STRICT): a
checkpoint carries exactly one line by the log's key. The proofs, cosignatures and
receipts half is tests/helpers/spec_receipts.py, the tiles half spec_tiles.py.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "Checkpoint",
    "Key",
    "SpecError",
    "consistency_proof",
    "inclusion_proof",
    "open_note",
    "parse_key",
    "verify_consistency",
    "verify_inclusion",
]

HASH = 32
WIDTH = 256
EM_DASH = "\u2014"


class SpecError(Exception):
    """A rule of the specs (or owngate's docs) the data breaks."""


def check(condition: bool, rule: str) -> None:
    if not condition:
        raise SpecError(rule)


def b64(text: str) -> bytes:
    """RFC 4648 section 4 base64, canonical only (padding and zero pad bits)."""
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError as error:
        raise SpecError(f"not base64 ({error})") from None
    check(base64.b64encode(data).decode() == text, "non-canonical base64")
    return data


# --- signed-note ---------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    name: str
    key_id: bytes
    kind: int  # 0x01 note signature, 0x04 cosignature/v1
    public: bytes


def _check_name(name: str) -> None:
    check(name != "", "signed-note: key names MUST be non-empty")
    check(
        "+" not in name and not any(c.isspace() for c in name),
        "signed-note: key names MUST NOT contain Unicode spaces or plus",
    )


def key_id(name: str, kind: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public).digest()[:4]


def parse_key(vkey: str, kind: int = 0x01) -> Key:
    """A verifier key `name+hexid+base64(type || public key)`; `kind` its required type."""
    name, hexid, material = vkey.split("+", 2)
    _check_name(name)
    raw = b64(material)
    check(len(raw) == 33 and raw[0] == kind, f"vkey: not an Ed25519 key of type {kind:#04x}")
    check(re.fullmatch("[0-9a-f]{8}", hexid) is not None, "vkey: key id is 8 hex digits")
    check(key_id(name, kind, raw[1:]).hex() == hexid, "vkey: key id is not SHA-256(name...)")
    return Key(name, bytes.fromhex(hexid), kind, raw[1:])


@dataclass(frozen=True)
class Note:
    text: bytes  # including its final newline
    lines: list[tuple[str, bytes]]  # (key name, key id || signature)


def split_note(data: bytes) -> Note:
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("signed-note: notes MUST be valid UTF-8") from None
    check(
        not any(ord(c) < 0x20 and c != "\n" for c in decoded),
        "signed-note: no ASCII control characters other than newline",
    )
    check(decoded.endswith("\n"), "signed-note: every signature line ends in a newline")
    cut = decoded.rfind("\n\n")
    check(cut >= 0, "signed-note: text, a blank line, then signature lines")
    text, block = decoded[: cut + 1], decoded[cut + 2 :]
    lines: list[tuple[str, bytes]] = []
    for line in block[:-1].split("\n"):
        match = re.fullmatch(f"{EM_DASH} ([^ ]+) ([^ ]+)", line)
        check(match is not None, "signed-note: a signature line is '— <name> <base64>'")
        assert match is not None
        _check_name(match[1])
        signature = b64(match[2])
        check(len(signature) > 4, "signed-note: a signature is key id (4) || signature")
        lines.append((match[1], signature))
    check(len(lines) >= 1, "signed-note: one or more signature lines")
    check(len(lines) <= 100, "signed-note: too many signatures")
    return Note(text.encode(), lines)


def open_note(data: bytes, keys: list[Key]) -> Note:
    """The note, verified: every line by a known (name, key id) must verify, unknown ones
    are ignored, and at least one known one must be there."""
    note = split_note(data)
    known = {(k.name, k.key_id): k for k in keys if k.kind == 0x01}
    verified = 0
    seen: set[tuple[str, bytes]] = set()
    for name, signature in note.lines:
        key = known.get((name, signature[:4]))
        if key is None:
            continue  # signed-note: verifiers MUST ignore signatures from unknown keys
        check((name, signature[:4]) not in seen, "STRICT: one line per log key")
        seen.add((name, signature[:4]))
        check(len(signature) == 68, "signed-note: an Ed25519 line is 4 + 64 bytes")
        try:
            Ed25519PublicKey.from_public_bytes(key.public).verify(signature[4:], note.text)
        except InvalidSignature:
            raise SpecError("signed-note: a signature from a known key fails") from None
        verified += 1
    check(verified > 0, "signed-note: no signature from a known key verifies")
    return note


# --- tlog-checkpoint -----------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...]
    note: bytes  # as served
    text: bytes


def parse_checkpoint(data: bytes, keys: list[Key], origin: str) -> Checkpoint:
    note = open_note(data, keys)
    lines = note.text.decode()[:-1].split("\n")
    check(len(lines) >= 3, "tlog-checkpoint: at least three non-empty lines")
    check(all(lines), "tlog-checkpoint: lines (extension lines too) are non-empty")
    check(lines[0] == origin, "tlog-checkpoint: the origin is the log's")
    check(
        re.fullmatch(r"0|[1-9][0-9]*", lines[1]) is not None,
        "tlog-checkpoint: tree size in decimal with no leading zeroes",
    )
    root = b64(lines[2])
    check(len(root) == HASH, "tlog-checkpoint: the root hash is a 32-byte SHA-256")
    check(
        any(name == origin for name, _ in note.lines),
        "tlog-checkpoint: the log's key name SHOULD match the origin (owngate's docs: it does)",
    )
    return Checkpoint(origin, int(lines[1]), root, tuple(lines[3:]), data, note.text)


# --- RFC 6962 / 9162 ---------------------------------------------------------------------


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:  # the largest power of two smaller than n
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(hashes: list[bytes]) -> bytes:
    """RFC 6962 section 2.1 Merkle Tree Hash over leaf hashes."""
    if not hashes:
        return hashlib.sha256(b"").digest()
    if len(hashes) == 1:
        return hashes[0]
    k = _split(len(hashes))
    return node_hash(mth(hashes[:k]), mth(hashes[k:]))


def inclusion_proof(index: int, hashes: list[bytes]) -> list[bytes]:
    """RFC 6962 section 2.1.1 PATH(m, D[n]), leaf side first."""
    if len(hashes) <= 1:
        return []
    k = _split(len(hashes))
    if index < k:
        return [*inclusion_proof(index, hashes[:k]), mth(hashes[k:])]
    return [*inclusion_proof(index - k, hashes[k:]), mth(hashes[:k])]


def consistency_proof(old: int, hashes: list[bytes]) -> list[bytes]:
    """RFC 6962 section 2.1.2 PROOF(m, D[n])."""

    def sub(m: int, d: list[bytes], whole: bool) -> list[bytes]:
        if m == len(d):
            return [] if whole else [mth(d)]
        k = _split(len(d))
        if m <= k:
            return [*sub(m, d[:k], whole), mth(d[k:])]
        return [*sub(m - k, d[k:], False), mth(d[:k])]

    return sub(old, hashes, True) if 0 < old < len(hashes) else []


def verify_inclusion(leaf: bytes, index: int, size: int, path: list[bytes], root: bytes) -> None:
    """RFC 9162 section 2.1.3.2."""
    check(0 <= index < size, "RFC 9162: leaf index below the tree size")
    fn, sn, r = index, size - 1, leaf
    for p in path:
        check(sn != 0, "RFC 9162: inclusion proof too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    check(sn == 0 and r == root, "RFC 9162: inclusion proof does not reach the root")


def verify_consistency(
    old: int, new: int, proof: list[bytes], old_root: bytes, new_root: bytes
) -> None:
    """RFC 9162 section 2.1.4.2."""
    check(0 < old <= new, "RFC 9162: consistency needs 0 < first <= second")
    if old == new:
        check(not proof and old_root == new_root, "RFC 9162: equal sizes, equal roots")
        return
    path = list(proof)
    if old & (old - 1) == 0:
        path.insert(0, old_root)
    check(bool(path), "RFC 9162: empty consistency proof")
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        check(sn != 0, "RFC 9162: consistency proof too long")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    check(fr == old_root and sr == new_root and sn == 0, "RFC 9162: not consistent")
