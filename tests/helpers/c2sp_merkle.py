"""RFC 6962 / RFC 9162 §2.1 Merkle trees for the from-the-spec verifier
(tests/helpers/c2sp_verifier.py): tree hashes, audit paths and consistency proofs built
from leaf hashes, and their verification by the RFC 9162 algorithms. Imports nothing of
`gateway`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = [
    "HASH",
    "Rejected",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "root_of",
    "verify_consistency",
    "verify_inclusion",
]

HASH = 32  # SHA-256


class Rejected(Exception):
    """The artefact does not verify; the message says why."""


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    return 1 << ((n - 1).bit_length() - 1)  # largest power of two smaller than n


def root_of(leaves: Sequence[bytes]) -> bytes:
    """MTH over leaf hashes (RFC 6962 §2.1)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return _node(root_of(leaves[:k]), root_of(leaves[k:]))


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """PATH(m, D[n]) of RFC 6962 §2.1.1, over leaf hashes."""
    if len(leaves) <= 1:
        return []
    k = _split(len(leaves))
    if index < k:
        return [*inclusion_proof(leaves[:k], index), root_of(leaves[k:])]
    return [*inclusion_proof(leaves[k:], index - k), root_of(leaves[:k])]


def consistency_proof(leaves: Sequence[bytes], m: int) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 6962 §2.1.2, over leaf hashes."""

    def subproof(m: int, part: Sequence[bytes], whole: bool) -> list[bytes]:
        if m == len(part):
            return [] if whole else [root_of(part)]
        k = _split(len(part))
        if m <= k:
            return [*subproof(m, part[:k], whole), root_of(part[k:])]
        return [*subproof(m - k, part[k:], False), root_of(part[:k])]

    return subproof(m, leaves, True)


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """RFC 9162 §2.1.3.2."""
    if index >= size:
        raise Rejected(f"inclusion: index {index} is not below tree size {size}")
    if any(len(h) != HASH for h in (leaf, root, *proof)):
        raise Rejected("inclusion: a hash is not 32 bytes")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise Rejected("inclusion: proof is too long")
        if fn & 1 or fn == sn:
            r = _node(p, r)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = _node(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise Rejected("inclusion: proof is too short")
    if r != root:
        raise Rejected("inclusion: proof does not lead to the root")


def verify_consistency(
    size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes
) -> None:
    """RFC 9162 §2.1.4.2 (size1 = 0 proves nothing and is refused)."""
    if not 0 < size1 <= size2:
        raise Rejected(f"consistency: sizes {size1} and {size2} are not 0 < size1 <= size2")
    if size1 == size2:
        if proof or root1 != root2:
            raise Rejected("consistency: equal sizes need equal roots and an empty proof")
        return
    if not proof:
        raise Rejected("consistency: empty proof")
    if any(len(h) != HASH for h in proof):
        raise Rejected("consistency: a proof hash is not 32 bytes")
    path = [root1, *proof] if size1 & (size1 - 1) == 0 else list(proof)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise Rejected("consistency: proof is too long")
        if fn & 1 or fn == sn:
            fr, sr = _node(c, fr), _node(c, sr)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = _node(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0 or fr != root1 or sr != root2:
        raise Rejected("consistency: proof does not lead to both roots")
