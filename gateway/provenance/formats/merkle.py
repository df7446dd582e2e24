"""RFC 6962 / RFC 9162 Merkle tree hashing, proof construction and proof verification.

leaf = SHA-256(0x00 || data), node = SHA-256(0x01 || left || right), and the hash of the
empty tree is SHA-256(""). Proofs are built from a `NodeReader`: a callable giving the hash
of the complete, aligned subtree at (height, index), i.e. MTH(D[index*2**h:(index+1)*2**h]).
Verification follows RFC 9162 sections 2.1.3.2 and 2.1.4.2 and the conventions of
transparency-dev/merkle (a consistency proof from size 0 is an error).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from gateway.provenance.errors import ProofError

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "CompactRange",
    "NodeReader",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "range_hash",
    "root_from_leaves",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

#: hash of the complete subtree at (height, index); height 0 is a leaf hash.
NodeReader = Callable[[int, int], bytes]


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(size: int) -> int:
    """The largest power of two strictly smaller than `size` (size >= 2)."""
    return 1 << ((size - 1).bit_length() - 1)


def root_from_leaves(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH of a sequence of leaf hashes (RFC 6962 section 2.1)."""
    stack = CompactRange()
    for item in leaf_hashes:
        stack.append(item)
    return stack.root()


class CompactRange:
    """The right edge of a growing tree: one complete subtree hash per set bit of `size`.

    `append` costs amortised O(1) hashes and `root` O(log size); memory is O(log size).
    """

    __slots__ = ("_hashes", "_heights", "size")

    def __init__(self) -> None:
        self.size = 0
        self._heights: list[int] = []
        self._hashes: list[bytes] = []

    def append(self, leaf: bytes) -> None:
        height, current = 0, leaf
        heights, hashes = self._heights, self._hashes
        while heights and heights[-1] == height:
            heights.pop()
            current = node_hash(hashes.pop(), current)
            height += 1
        heights.append(height)
        hashes.append(current)
        self.size += 1

    @classmethod
    def from_reader(cls, size: int, read: NodeReader) -> CompactRange:
        """The compact range of a tree of `size` leaves, from stored subtree hashes."""
        compact = cls()
        start = 0
        for height in range(size.bit_length() - 1, -1, -1):
            if size >> height & 1:
                compact._heights.append(height)
                compact._hashes.append(read(height, start >> height))
                start += 1 << height
        compact.size = size
        return compact

    def root(self) -> bytes:
        if not self._hashes:
            return EMPTY_ROOT
        current = self._hashes[-1]
        for left in reversed(self._hashes[:-1]):
            current = node_hash(left, current)
        return current


def range_hash(begin: int, end: int, read: NodeReader) -> bytes:
    """MTH(D[begin:end]) where `begin` is aligned to the RFC 6962 split of the range."""
    size = end - begin
    if size <= 0:
        raise ValueError(f"empty range [{begin}, {end})")
    if size & (size - 1) == 0 and begin % size == 0:
        return read(size.bit_length() - 1, begin // size)
    k = _split(size)
    return node_hash(range_hash(begin, begin + k, read), range_hash(begin + k, end, read))


def inclusion_proof(index: int, size: int, read: NodeReader) -> list[bytes]:
    """The RFC 6962 audit path of leaf `index` in the tree of `size` leaves, leaf side first."""
    if not 0 <= index < size:
        raise ValueError(f"index {index} is outside a tree of size {size}")
    proof: list[bytes] = []
    begin, end = 0, size
    while end - begin > 1:  # at most 64 rounds: the range halves each time
        k = _split(end - begin)
        if index < begin + k:
            proof.append(range_hash(begin + k, end, read))
            end = begin + k
        else:
            proof.append(range_hash(begin, begin + k, read))
            begin += k
    proof.reverse()
    return proof


def consistency_proof(size1: int, size2: int, read: NodeReader) -> list[bytes]:
    """The RFC 6962 consistency proof between trees of `size1` and `size2` leaves."""
    if not 0 < size1 <= size2:
        raise ValueError(f"no consistency proof from size {size1} to size {size2}")
    proof: list[bytes] = []
    begin, end, m, complete = 0, size2, size1, True
    while m != end - begin:  # SUBPROOF(m, D[begin:end], complete), unrolled; <= 64 rounds
        k = _split(end - begin)
        if m <= k:
            proof.append(range_hash(begin + k, end, read))
            end = begin + k
        else:
            proof.append(range_hash(begin, begin + k, read))
            begin, m, complete = begin + k, m - k, False
    if not complete:
        proof.append(range_hash(begin, end, read))
    proof.reverse()
    return proof


def _check_hash(name: str, value: bytes) -> None:
    if len(value) != HASH_SIZE:
        raise ProofError(f"{name} is {len(value)} bytes, not a {HASH_SIZE}-byte SHA-256 hash")


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Raise ProofError unless `proof` shows leaf hash `leaf` at `index` in the tree `root`."""
    if not 0 <= index < size:
        raise ProofError(f"index {index} is outside a tree of size {size}")
    _check_hash("leaf hash", leaf)
    fn, sn, current = index, size - 1, leaf
    for position, sibling in enumerate(proof):
        _check_hash(f"proof hash {position}", sibling)
        if sn == 0:
            raise ProofError(f"inclusion proof is too long ({len(proof)} hashes)")
        if fn & 1 or fn == sn:
            current = node_hash(sibling, current)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            current = node_hash(current, sibling)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError(f"inclusion proof is too short ({len(proof)} hashes)")
    if current != root:
        raise ProofError(f"inclusion proof for index {index} does not lead to the root hash")


def verify_consistency(
    size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes
) -> None:
    """Raise ProofError unless `proof` shows tree (size1, root1) is a prefix of (size2, root2)."""
    if size2 < size1:
        raise ProofError(f"tree size went backwards from {size1} to {size2}")
    if size1 == size2:
        if proof:
            raise ProofError("trees of the same size need an empty consistency proof")
        if size1 == 0:
            raise ProofError("consistency proof with an empty tree")
        if root1 != root2:
            raise ProofError(f"two different root hashes for the same tree size {size1}")
        return
    if size1 == 0:
        raise ProofError("consistency proof with an empty tree")
    if not proof:
        raise ProofError(f"empty consistency proof from size {size1} to {size2}")
    for position, item in enumerate(proof):
        _check_hash(f"proof hash {position}", item)
    path = list(proof)
    if size1 & (size1 - 1) == 0:
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    first = second = path[0]
    for item in path[1:]:
        if sn == 0:
            raise ProofError(f"consistency proof is too long ({len(proof)} hashes)")
        if fn & 1 or fn == sn:
            first = node_hash(item, first)
            second = node_hash(item, second)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            second = node_hash(second, item)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError(f"consistency proof is too short ({len(proof)} hashes)")
    if first != root1:
        raise ProofError(f"consistency proof does not lead to the size-{size1} root hash")
    if second != root2:
        raise ProofError(f"consistency proof does not lead to the size-{size2} root hash")
