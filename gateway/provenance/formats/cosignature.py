"""C2SP tlog-cosignature v1 (Ed25519): a witness's timestamped signature on a checkpoint.

A cosignature is a signed-note signature line `— <name> base64(key id || timestamp ||
signature)` where the key id is SHA-256(name || "\\n" || 0x04 || public key)[:4], the
timestamp a big-endian uint64 of POSIX seconds, and the Ed25519 signature is over

    cosignature/v1
    time <timestamp>
    <the whole checkpoint note body, extension lines included>

A witness key is an ordinary Ed25519 signing key (`owngate keys new --signing NAME`
writes one); only the key id's algorithm byte (0x04, not 0x01) and the signed message
differ, so the same key never produces a signature valid in both roles. Its verifier key
is published as `name+hexid+base64(0x04 || public key)`.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.provenance.errors import KeyFormatError, MalformedError, SignatureError

# `_split_note` and `_parse_signature_line` are the note module's own parser of the signature
# block, reused so that one parser decides what a signed note is.
from gateway.provenance.formats.note import (
    ALG_ED25519,
    MAX_SIGNATURES,
    NoteSignature,
    Signer,
    Verifier,
    _parse_signature_line,
    _split_note,
    key_id,
    valid_key_name,
)

__all__ = [
    "ALG_COSIGNATURE_V1",
    "MAX_TIMESTAMP",
    "Cosignature",
    "CosignatureVerifier",
    "Cosigner",
    "attach_cosignatures",
    "cosigned_message",
    "distinct_witnesses",
    "find_cosignature",
    "parse_cosignature_line",
    "unambiguous_witnesses",
    "verify_cosignature",
]

ALG_COSIGNATURE_V1 = 0x04
MAX_TIMESTAMP = 2**63 - 1
_HEADER = "cosignature/v1\n"
_SIGNATURE_SIZE = 64
_SIG_PREFIX = "\u2014 "


def cosigned_message(note_text: str, timestamp: int) -> bytes:
    """The exact bytes a cosignature/v1 signs: header, time line, then the note body."""
    if not 0 <= timestamp <= MAX_TIMESTAMP:
        raise ValueError(f"cosignature timestamp {timestamp} is outside 0..2^63-1")
    if not note_text.endswith("\n"):
        raise MalformedError("the cosigned note body must end with a newline")
    return f"{_HEADER}time {timestamp}\n{note_text}".encode()


@dataclass(frozen=True, slots=True)
class Cosignature:
    """One cosignature line, parsed: who signed, when (POSIX seconds) and the signature."""

    name: str
    key_id: int
    timestamp: int
    signature: bytes

    def line(self) -> str:
        blob = struct.pack(">IQ", self.key_id, self.timestamp) + self.signature
        return f"{_SIG_PREFIX}{self.name} {base64.b64encode(blob).decode()}\n"

    @classmethod
    def from_note_signature(cls, sig: NoteSignature) -> Cosignature:
        """Read the timestamped signature out of a note signature (key id already split off)."""
        if len(sig.signature) != 8 + _SIGNATURE_SIZE:
            raise MalformedError(
                f"signature by {sig.name}+{sig.key_id:08x} is {len(sig.signature) + 4} bytes, "
                "not a 76-byte timestamped Ed25519 cosignature"
            )
        (timestamp,) = struct.unpack(">Q", sig.signature[:8])
        if timestamp > MAX_TIMESTAMP:
            raise MalformedError(f"cosignature by {sig.name} has a timestamp above 2^63-1")
        return cls(sig.name, sig.key_id, timestamp, sig.signature[8:])


def parse_cosignature_line(line: str) -> Cosignature:
    """Parse `— <name> <base64>` (with or without its final newline) as a cosignature."""
    return Cosignature.from_note_signature(_parse_signature_line(line.removesuffix("\n")))


class Cosigner:
    """A witness's signing side: an Ed25519 key that produces cosignature/v1 lines."""

    __slots__ = ("_signer", "key_id", "name", "public_key")

    def __init__(self, signer: Signer) -> None:
        self._signer = signer
        self.name = signer.name
        self.public_key = signer.public_key
        self.key_id = key_id(self.name, bytes([ALG_COSIGNATURE_V1]) + self.public_key)

    @property
    def vkey(self) -> str:
        """The verifier key to publish: `name+hexid+base64(0x04 || public key)`."""
        encoded = base64.b64encode(bytes([ALG_COSIGNATURE_V1]) + self.public_key).decode()
        return f"{self.name}+{self.key_id:08x}+{encoded}"

    def cosign(self, note_text: str, timestamp: int) -> Cosignature:
        signature = self._signer.sign(cosigned_message(note_text, timestamp))
        return Cosignature(self.name, self.key_id, timestamp, signature)

    def verifier(self) -> CosignatureVerifier:
        return CosignatureVerifier(self.vkey)

    def __str__(self) -> str:
        return f"{self.name}+{self.key_id:08x}"


def _decode_key(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise KeyFormatError("witness verifier key is not valid base64") from exc


class CosignatureVerifier:
    """Checks cosignature/v1 signatures by one witness key.

    Accepts the witness's cosignature verifier key (algorithm 0x04) or, as
    transparency-dev/formats does, the plain Ed25519 note verifier key (0x01) of the same
    key, whose key id is then recomputed for 0x04.
    """

    __slots__ = ("_public", "key_id", "name", "public_key", "vkey")

    def __init__(self, vkey: str) -> None:
        vkey = vkey.strip()
        fields = vkey.split("+", 2)
        if len(fields) != 3:
            raise KeyFormatError("witness verifier key must look like name+hexid+base64key")
        name, hex_id, encoded = fields
        if not valid_key_name(name):
            raise KeyFormatError(f"witness key name {name!r} is empty or has space or '+'")
        if len(hex_id) != 8 or any(c not in "0123456789abcdefABCDEF" for c in hex_id):
            raise KeyFormatError(f"witness key id {hex_id!r} is not 8 hex digits")
        key = _decode_key(encoded)
        if len(key) != 33 or key[0] not in (ALG_COSIGNATURE_V1, ALG_ED25519):
            raise KeyFormatError(
                "witness verifier key is not an Ed25519 key (algorithm 0x04 or 0x01, 32 bytes)"
            )
        if key_id(name, key) != int(hex_id, 16):
            raise KeyFormatError(f"witness key id {hex_id} does not match its key and name")
        self.name = name
        self.key_id = key_id(name, bytes([ALG_COSIGNATURE_V1]) + key[1:])
        cosigning = base64.b64encode(bytes([ALG_COSIGNATURE_V1]) + key[1:]).decode()
        self.vkey = f"{name}+{self.key_id:08x}+{cosigning}"
        # The signed message names neither the key nor the witness: a line by this key
        # verifies under any name given to the same public key (see `distinct_witnesses`).
        self.public_key = key[1:]
        self._public = Ed25519PublicKey.from_public_bytes(key[1:])

    def matches(self, name: str, key_id: int) -> bool:
        return name == self.name and key_id == self.key_id

    def verify(self, note_text: str, cosignature: Cosignature) -> None:
        """Raise SignatureError unless `cosignature` is this witness's, over `note_text`."""
        if not self.matches(cosignature.name, cosignature.key_id):
            raise SignatureError(f"cosignature is by {cosignature.name}, not witness {self}")
        try:
            self._public.verify(
                cosignature.signature, cosigned_message(note_text, cosignature.timestamp)
            )
        except InvalidSignature as exc:
            raise SignatureError(f"invalid cosignature by witness {self}") from exc

    def __str__(self) -> str:
        return f"{self.name}+{self.key_id:08x}"


def distinct_witnesses(witnesses: Sequence[CosignatureVerifier]) -> None:
    """Raise ValueError when two of `witnesses` are one public key.

    A quorum counts witnesses, and a cosignature/v1 signs neither the witness's name nor its
    key id: whoever holds a cosigned note can copy a line under a second name given to the
    same key, and it verifies. One key given twice (or once as 0x01, once as 0x04) would
    likewise count twice.
    """
    seen: dict[bytes, CosignatureVerifier] = {}
    for witness in witnesses:
        first = seen.setdefault(witness.public_key, witness)
        if first is not witness:
            raise ValueError(
                f"witness keys {first} and {witness} are the same public key: "
                "one witness cannot count twice towards a quorum"
            )


def unambiguous_witnesses(
    witnesses: Sequence[CosignatureVerifier], logs: Sequence[Verifier] = ()
) -> None:
    """Raise KeyFormatError when a witness key and a log key of `logs`, or two witness
    keys, are different keys under one name and key id (naming both).

    A signature line names its key by `name+hexid` alone (32 bits, which a key holder can
    make collide; a cosignature's id hashes 0x04 where a log key's hashes 0x01, still 32
    bits), and every line under a trusted key's name and id is checked with that key
    (C2SP signed-note): the log key would check the twin witness's cosignatures (and
    fail the genuine note), the witness the log's signature line, two twin witnesses each
    other's lines. Refused before anything is read, as two log keys are (`keys.unambiguous`;
    tests/unit/test_witness_key_id_collision.py).
    """
    seen: dict[tuple[str, int], str] = {(v.name, v.key_id): f"log key {v.vkey}" for v in logs}
    for witness in witnesses:
        named = f"witness key {witness.vkey}"
        first = seen.setdefault((witness.name, witness.key_id), named)
        if first != named:
            raise KeyFormatError(
                f"{first} and {named} are two keys under one name and key id {witness}: a "
                "signature line names only those, so which key made it is ambiguous (each "
                "would check the other's lines, and a genuine note fail); trust one of them"
            )


def _as_verifier(witness: str | CosignatureVerifier) -> CosignatureVerifier:
    return witness if isinstance(witness, CosignatureVerifier) else CosignatureVerifier(witness)


def find_cosignature(
    note: bytes,
    witness: str | CosignatureVerifier,
    *,
    now: float,
    future_skew: float = 300.0,
) -> Cosignature | None:
    """The newest valid cosignature by `witness` on `note`, or None when it has none.

    Raises SignatureError when a line by the witness is bad or dated more than
    `future_skew` seconds after `now`, MalformedError for a note that is not one. A missing
    cosignature is for the caller to judge (`verify_cosignature` requires one).
    """
    verifier = _as_verifier(witness)
    text, lines = _split_note(note)
    newest: Cosignature | None = None
    for line in lines:
        sig = _parse_signature_line(line)
        if not verifier.matches(sig.name, sig.key_id):
            continue
        cosignature = Cosignature.from_note_signature(sig)
        verifier.verify(text, cosignature)
        if cosignature.timestamp > now + future_skew:
            raise SignatureError(
                f"cosignature by witness {verifier} is dated {cosignature.timestamp}, "
                f"more than {future_skew:g}s after now ({int(now)})"
            )
        if newest is None or cosignature.timestamp > newest.timestamp:
            newest = cosignature
    return newest


def verify_cosignature(
    note: bytes,
    witness: str | CosignatureVerifier,
    *,
    now: float,
    future_skew: float = 300.0,
) -> Cosignature:
    """Check that `note` carries a valid cosignature by `witness`; return the newest one.

    `now` is the verifier's time in POSIX seconds: a cosignature dated more than
    `future_skew` seconds after it is refused (the spec allows refusing future times).
    Raises SignatureError (no cosignature by the witness, a bad one, a future one) or
    MalformedError; it never returns a bool. Signatures by other keys, the log's included,
    are ignored: check the log's own signature with `open_checkpoint`.
    """
    verifier = _as_verifier(witness)
    newest = find_cosignature(note, verifier, now=now, future_skew=future_skew)
    if newest is None:
        raise SignatureError(f"note has no cosignature by witness {verifier}")
    return newest


def attach_cosignatures(
    note: bytes,
    lines: bytes,
    witness: str | CosignatureVerifier,
    *,
    now: float,
    future_skew: float = 300.0,
    not_before: float | None = None,
) -> bytes:
    """`note` with the witness's newest cosignature line from `lines` appended, verified.

    `lines` is a witness's add-checkpoint answer; lines by other keys are dropped (the
    spec tells clients to ignore them). Of the lines by `witness`, only the newest (by
    timestamp) is kept, so only it is verified: SignatureError unless it is valid, dated at
    most `future_skew` seconds after `now` and, with `not_before`, not before that (an
    answer dated before it was asked for is a replay, or its witness's clock is wrong).
    Lines that are not signature lines, or not cosignatures, make the answer malformed, and
    so do more than MAX_SIGNATURES (100) lines: 4,000 short lines by other keys in a 64 KiB
    answer took 50 ms of the gateway's event loop to parse, at every attempt.
    Keeping one line means a witness answering with many cannot fill the note past the
    signature lines a reader accepts; verifying one means it cannot make the gateway check
    hundreds of signatures (60-90 ms of its event loop for the 500 a 64 KiB answer holds)
    at every checkpoint.
    """
    verifier = _as_verifier(witness)
    if not lines.endswith(b"\n"):
        raise MalformedError("a witness answer must end with a newline")
    try:
        answer = lines.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError("the witness answer is not valid UTF-8") from exc
    _split_note(note)  # a note, or MalformedError
    if answer.count("\n") > MAX_SIGNATURES:  # counted before any is parsed
        raise MalformedError(f"the witness answer has more than {MAX_SIGNATURES} lines")
    newest: Cosignature | None = None
    for line in answer[:-1].split("\n"):
        sig = _parse_signature_line(line)
        if not verifier.matches(sig.name, sig.key_id):
            continue
        cosignature = Cosignature.from_note_signature(sig)
        if newest is None or cosignature.timestamp > newest.timestamp:
            newest = cosignature
    if newest is None:
        raise SignatureError(f"the witness answer has no cosignature by witness {verifier}")
    if not_before is not None and newest.timestamp < not_before:
        raise SignatureError(
            f"cosignature by witness {verifier} is dated {newest.timestamp}, before "
            f"{int(not_before)}: replayed, or the witness's clock is wrong"
        )
    combined = note + newest.line().encode("utf-8")
    verify_cosignature(combined, verifier, now=now, future_skew=future_skew)  # not ahead
    return combined
