"""C2SP tlog-proof: an offline-verifiable proof that one entry is in a signed checkpoint.

c2sp.org/tlog-proof@v1
extra <base64>            (optional; here: the entry itself, so its hash can be rebuilt)
index <N>
<base64 hash>...          (RFC 6962 audit path, leaf side first)
<blank line>
<signed checkpoint, verbatim>
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.checkpoint import MAX_TREE_SIZE, SignedCheckpoint, open_checkpoint
from gateway.provenance.formats.merkle import HASH_SIZE, leaf_hash, verify_inclusion
from gateway.provenance.formats.note import Verifier

__all__ = ["PROOF_HEADER", "TlogProof", "verify_tlog_proof"]

PROOF_HEADER = "c2sp.org/tlog-proof@v1"
_MAX_HASHES = 64  # an audit path in a tree of at most 2^64 - 1 leaves


def _b64(text: str, what: str) -> bytes:
    try:
        decoded = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise MalformedError(f"tlog-proof: {what} is not valid base64") from exc
    if base64.b64encode(decoded).decode("ascii") != text:
        raise MalformedError(f"tlog-proof: {what} is not canonical base64")
    return decoded


@dataclass(frozen=True, slots=True)
class TlogProof:
    index: int
    hashes: tuple[bytes, ...]
    checkpoint: bytes  # the signed note, verbatim
    extra: bytes | None = None

    def format(self) -> str:
        lines = [PROOF_HEADER]
        if self.extra is not None:
            lines.append(f"extra {base64.b64encode(self.extra).decode()}")
        lines.append(f"index {self.index}")
        lines.extend(base64.b64encode(item).decode() for item in self.hashes)
        return "\n".join(lines) + "\n\n" + self.checkpoint.decode("utf-8")

    @classmethod
    def parse(cls, text: str) -> TlogProof:
        head, separator, checkpoint = text.partition("\n\n")
        if not separator:
            raise MalformedError("tlog-proof: no blank line before the checkpoint")
        lines = head.split("\n")
        if lines[0] != PROOF_HEADER:
            raise MalformedError(f"tlog-proof: first line must be {PROOF_HEADER}")
        position = 1
        extra = None
        if position < len(lines) and lines[position].startswith("extra "):
            extra = _b64(lines[position][len("extra ") :], "extra data")
            position += 1
        if position >= len(lines) or not lines[position].startswith("index "):
            raise MalformedError("tlog-proof: missing index line")
        index_text = lines[position][len("index ") :]
        if (
            not index_text.isascii()
            or not index_text.isdecimal()
            or len(index_text) > len(str(MAX_TREE_SIZE))
            or str(int(index_text)) != index_text
        ):
            raise MalformedError(f"tlog-proof: index {index_text[:30]!r} is not a plain decimal")
        if int(index_text) >= MAX_TREE_SIZE:
            raise MalformedError("tlog-proof: index is outside 0..2^64-2")
        hashes: list[bytes] = []
        for number, line in enumerate(lines[position + 1 :]):
            if not line:
                raise MalformedError("tlog-proof: empty line inside the inclusion proof")
            if len(hashes) == _MAX_HASHES:
                raise MalformedError(f"tlog-proof: more than {_MAX_HASHES} proof hashes")
            item = _b64(line, f"proof hash {number}")
            if len(item) != HASH_SIZE:
                raise MalformedError(f"tlog-proof: proof hash {number} is not {HASH_SIZE} bytes")
            hashes.append(item)
        return cls(int(index_text), tuple(hashes), checkpoint.encode("utf-8"), extra)


def verify_tlog_proof(
    proof: TlogProof,
    entry: bytes,
    verifiers: Iterable[Verifier],
    *,
    origin: str | None = None,
) -> SignedCheckpoint:
    """Raise unless `entry` is at `proof.index` in a checkpoint signed by a trusted key.

    Returns the verified checkpoint (callers compare its size to what they have seen).
    """
    signed = open_checkpoint(proof.checkpoint, verifiers, origin=origin)
    checkpoint = signed.checkpoint
    verify_inclusion(leaf_hash(entry), proof.index, checkpoint.size, proof.hashes, checkpoint.root)
    return signed
