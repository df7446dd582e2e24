"""C2SP tlog-checkpoint: the signed statement "the log `origin` has `size` entries, root `root`".

Body: origin line, decimal tree size (no leading zeroes), base64 root hash, then optional
non-empty extension lines; the body is a signed note (see `note`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.provenance.errors import MalformedError, SignatureError
from gateway.provenance.formats.merkle import HASH_SIZE
from gateway.provenance.formats.note import Note, Signer, Verifier, open_note, sign_note
from gateway.provenance.formats.receipt_payload import MAX_ORIGIN, plain_origin

__all__ = ["MAX_TREE_SIZE", "Checkpoint", "SignedCheckpoint", "open_checkpoint", "sign_checkpoint"]

#: tree sizes are uint64 (C2SP tlog-checkpoint); a longer decimal is refused before int(),
#: which raises ValueError past 4300 digits.
MAX_TREE_SIZE = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.origin or "\n" in self.origin:
            raise MalformedError("checkpoint origin must be one non-empty line")
        if not plain_origin(self.origin):
            # A note has no C0 control (note.py); nor may the origin hold DEL, C1, a
            # bidirectional override or a line separator: an auditor's terminal shows it.
            raise MalformedError(
                f"checkpoint origin must be 1-{MAX_ORIGIN} printable characters (no control "
                "or format character, no space but the ASCII one)"
            )
        if self.origin.startswith("DSSEv1"):
            raise MalformedError("checkpoint origin must not start with DSSEv1 (receipt domain)")
        if not 0 <= self.size <= MAX_TREE_SIZE:
            raise MalformedError("checkpoint size is outside 0..2^64-1")
        if len(self.root) != HASH_SIZE:
            raise MalformedError("checkpoint root hash is not 32 bytes")
        for line in self.extensions:
            if not line or "\n" in line:
                raise MalformedError("checkpoint extension lines must be non-empty single lines")

    def text(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode()]
        lines.extend(self.extensions)
        return "".join(f"{line}\n" for line in lines)

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "":
            raise MalformedError("checkpoint needs origin, size and root hash lines")
        origin, size_text, root_text, *extensions = lines[:-1]
        if not size_text.isdecimal() or not size_text.isascii():
            # Not quoted: a high-water file read by a candidate config (admin API) may be
            # any file of the gateway's, whose second line is then a secret's
            raise MalformedError("checkpoint size (its second line) is not a decimal number")
        if len(size_text) > len(str(MAX_TREE_SIZE)):
            raise MalformedError("checkpoint size is outside 0..2^64-1")
        if size_text != str(int(size_text)):
            raise MalformedError(f"checkpoint size {size_text!r} has leading zeroes")
        try:
            root = base64.b64decode(root_text.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise MalformedError("checkpoint root hash is not valid base64") from exc
        if base64.b64encode(root).decode("ascii") != root_text:  # "the base64 encoding"
            raise MalformedError("checkpoint root hash is not canonical base64")
        return cls(origin, int(size_text), root, tuple(extensions))


@dataclass(frozen=True, slots=True)
class SignedCheckpoint:
    """A checkpoint, the note bytes that carry it and the signatures that verified."""

    checkpoint: Checkpoint
    note: bytes
    signatures: Note


def sign_checkpoint(checkpoint: Checkpoint, signers: Sequence[Signer]) -> bytes:
    return sign_note(checkpoint.text(), signers)


def open_checkpoint(
    data: bytes, verifiers: Iterable[Verifier], *, origin: str | None = None
) -> SignedCheckpoint:
    """Verify a signed checkpoint; raises SignatureError or MalformedError.

    When `origin` is given the checkpoint must carry exactly that origin line. A log's key
    is named for its origin (docs/provenance.md, "Keys"; a witness trusts a key only for
    the log its name is): when `verifiers` hold a key named for the checkpoint's origin,
    one of those must have signed it, not only a key another log's (a replica's).
    """
    verifiers = tuple(verifiers)
    note = open_note(data, verifiers)
    checkpoint = Checkpoint.parse(note.text)
    if origin is not None and checkpoint.origin != origin:
        raise MalformedError(
            f"checkpoint origin is {checkpoint.origin!r}, expected {origin!r}: another log"
        )
    own = [str(v) for v in verifiers if v.name == checkpoint.origin]
    if own and all(sig.name != checkpoint.origin for sig in note.verified):
        signers = ", ".join(f"{sig.name}+{sig.key_id:08x}" for sig in note.verified)
        raise SignatureError(
            f"the checkpoint is of the log {checkpoint.origin!r}, but it is signed by "
            f"{signers}, not by that log's key ({', '.join(own)}): another log's key signed it"
        )
    return SignedCheckpoint(checkpoint, data, note)
