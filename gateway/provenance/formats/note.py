"""C2SP signed-note: Ed25519 signers and verifiers, key strings, signing and opening notes.

A note is UTF-8 text of newline-terminated lines, a blank line, then signature lines
`— <name> <base64(key id || signature)>`. The key id is the first 4 bytes (big-endian
uint32) of SHA-256(name || "\\n" || 0x01 || public key). Key strings follow Go's
golang.org/x/mod/sumdb/note: verifier `name+hexid+base64(0x01 || pubkey)` and signer
`PRIVATE+KEY+name+hexid+base64(0x01 || seed)`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gateway.provenance.errors import KeyFormatError, MalformedError, SignatureError

__all__ = [
    "ALG_ED25519",
    "MAX_SIGNATURES",
    "Note",
    "NoteSignature",
    "Signer",
    "Verifier",
    "key_id",
    "open_note",
    "sign_note",
    "valid_key_name",
]

ALG_ED25519 = 0x01
MAX_SIGNATURES = 100
_SIG_PREFIX = "\u2014 "  # em dash and space
_PRIVATE_PREFIX = "PRIVATE+KEY+"


def valid_key_name(name: str) -> bool:
    """A key name is non-empty, has no whitespace and no '+' (as Go's isValidName)."""
    return bool(name) and "+" not in name and not any(c.isspace() for c in name)


def key_id(name: str, key: bytes) -> int:
    """The 32-bit key id of `key` (algorithm byte included) under `name`."""
    digest = hashlib.sha256(name.encode() + b"\n" + key).digest()
    value: int = struct.unpack(">I", digest[:4])[0]
    return value


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise KeyFormatError(f"{what} is not valid base64") from exc


def _split_key(text: str, parts: int, what: str) -> list[str]:
    fields = text.split("+", parts - 1)
    if len(fields) != parts:
        raise KeyFormatError(f"{what} must look like name+hexid+base64key")
    return fields


def _parse_id(hex_id: str, what: str) -> int:
    if len(hex_id) != 8 or any(c not in "0123456789abcdefABCDEF" for c in hex_id):
        # A signer's is never quoted: in a damaged signer key this field can hold part
        # of the secret (base64 has '+', the field separator).
        shown = f" {hex_id!r}" if what == "verifier" else ""
        raise KeyFormatError(f"{what} key id{shown} is not 8 hex digits")
    return int(hex_id, 16)


class Verifier:
    """An Ed25519 note verifier, built from a verifier key string."""

    __slots__ = ("_public", "key_id", "name", "public_key", "vkey")

    def __init__(self, vkey: str) -> None:
        vkey = vkey.strip()
        name, hex_id, key64 = _split_key(vkey, 3, "verifier key")
        if not valid_key_name(name):
            raise KeyFormatError(f"verifier key name {name!r} is empty or has space or '+'")
        expected = _parse_id(hex_id, "verifier")
        key = _b64decode(key64, "verifier key")
        if not key:
            raise KeyFormatError("verifier key has no key bytes")
        if key_id(name, key) != expected:
            raise KeyFormatError(f"verifier key id {hex_id} does not match its key and name")
        if key[0] != ALG_ED25519 or len(key) != 33:
            raise KeyFormatError("verifier key is not an Ed25519 key (algorithm 0x01, 32 bytes)")
        self.name = name
        self.key_id = expected
        self.vkey = vkey
        self.public_key = key[1:]
        self._public = Ed25519PublicKey.from_public_bytes(key[1:])

    def verify(self, message: bytes, signature: bytes) -> None:
        """Raise SignatureError unless `signature` is this key's Ed25519 signature."""
        try:
            self._public.verify(signature, message)
        except InvalidSignature as exc:
            raise SignatureError(f"invalid signature for key {self}") from exc

    def __str__(self) -> str:
        return f"{self.name}+{self.key_id:08x}"


class Signer:
    """An Ed25519 note signer: a key name and a private key."""

    __slots__ = ("_private", "key_id", "name", "public_key")

    def __init__(self, name: str, private: Ed25519PrivateKey) -> None:
        if not valid_key_name(name):
            raise KeyFormatError(f"key name {name!r} is empty or has space or '+'")
        self.name = name
        self._private = private
        self.public_key = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = key_id(name, bytes([ALG_ED25519]) + self.public_key)

    @classmethod
    def from_seed(cls, name: str, seed: bytes) -> Signer:
        if len(seed) != 32:
            raise KeyFormatError("an Ed25519 seed is 32 bytes")
        return cls(name, Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_skey(cls, skey: str) -> Signer:
        """Parse a signer key string `PRIVATE+KEY+name+hexid+base64(0x01 || seed)`."""
        skey = skey.strip()
        if not skey.startswith(_PRIVATE_PREFIX):
            raise KeyFormatError("signer key must start with PRIVATE+KEY+")
        name, hex_id, key64 = _split_key(skey[len(_PRIVATE_PREFIX) :], 3, "signer key")
        expected = _parse_id(hex_id, "signer")
        key = _b64decode(key64, "signer key")
        if len(key) != 33 or key[0] != ALG_ED25519:
            raise KeyFormatError("signer key is not an Ed25519 key (algorithm 0x01, 32 bytes)")
        signer = cls.from_seed(name, key[1:])
        if signer.key_id != expected:
            raise KeyFormatError(f"signer key id {hex_id} does not match its key and name")
        return signer

    @property
    def vkey(self) -> str:
        encoded = base64.b64encode(bytes([ALG_ED25519]) + self.public_key).decode()
        return f"{self.name}+{self.key_id:08x}+{encoded}"

    def skey(self, seed: bytes) -> str:
        """The signer key string for this signer, given its seed (checked against the key)."""
        if Signer.from_seed(self.name, seed).public_key != self.public_key:
            raise KeyFormatError("seed does not belong to this signer")
        encoded = base64.b64encode(bytes([ALG_ED25519]) + seed).decode()
        return f"{_PRIVATE_PREFIX}{self.name}+{self.key_id:08x}+{encoded}"

    def verifier(self) -> Verifier:
        return Verifier(self.vkey)

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)

    def __str__(self) -> str:
        return f"{self.name}+{self.key_id:08x}"


@dataclass(frozen=True, slots=True)
class NoteSignature:
    name: str
    key_id: int
    signature: bytes


@dataclass(frozen=True, slots=True)
class Note:
    """An opened note: its text, the signatures that verified, and those by unknown keys."""

    text: str
    verified: tuple[NoteSignature, ...]
    unverified: tuple[NoteSignature, ...]


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise MalformedError("note text must end with a newline")
    for char in text:
        if char < " " and char != "\n":
            raise MalformedError(f"note text contains control character {ord(char):#04x}")


def sign_note(text: str, signers: Sequence[Signer]) -> bytes:
    """Sign `text` with every signer; returns the signed note's bytes."""
    _check_text(text)
    if "\n\n" in text:
        raise MalformedError("note text must not contain a blank line")
    if not signers:
        raise ValueError("a signed note needs at least one signer")
    message = text.encode("utf-8")
    lines = []
    for signer in signers:
        blob = struct.pack(">I", signer.key_id) + signer.sign(message)
        lines.append(f"{_SIG_PREFIX}{signer.name} {base64.b64encode(blob).decode()}\n")
    return message + b"\n" + "".join(lines).encode("utf-8")


def _parse_signature_line(line: str) -> NoteSignature:
    if not line.startswith(_SIG_PREFIX):
        raise MalformedError("signature line does not start with '\u2014 '")
    name, _, encoded = line[len(_SIG_PREFIX) :].partition(" ")
    if not valid_key_name(name) or not encoded:
        raise MalformedError(f"malformed signature line {line!r}")
    try:
        blob = base64.b64decode(encoded.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise MalformedError(f"signature by {name} is not valid base64") from exc
    if base64.b64encode(blob).decode("ascii") != encoded:  # one note, one spelling
        raise MalformedError(f"signature by {name} is not canonical base64")
    if len(blob) < 5:
        raise MalformedError(f"signature by {name} is too short")
    return NoteSignature(name, struct.unpack(">I", blob[:4])[0], blob[4:])


def _split_note(data: bytes) -> tuple[str, list[str]]:
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError("note is not valid UTF-8") from exc
    for char in decoded:
        if char < " " and char != "\n":
            raise MalformedError(f"note contains control character {ord(char):#04x}")
    split = decoded.rfind("\n\n")
    if split < 0:
        raise MalformedError("note has no blank line before its signatures")
    text, block = decoded[: split + 1], decoded[split + 2 :]
    if not block.endswith("\n"):
        raise MalformedError("note's last signature line does not end in a newline")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise MalformedError(f"note has more than {MAX_SIGNATURES} signatures")
    return text, lines


def open_note(data: bytes, verifiers: Iterable[Verifier]) -> Note:
    """Parse a signed note and check its signatures against `verifiers`.

    Raises MalformedError for bad syntax, SignatureError when a signature by a known key
    fails or when no known key signed the note.
    """
    text, lines = _split_note(data)
    known = {(v.name, v.key_id): v for v in verifiers}
    message = text.encode("utf-8")
    verified: list[NoteSignature] = []
    unverified: list[NoteSignature] = []
    seen: set[tuple[str, int]] = set()
    checked: set[str] = set()
    for line in lines:
        sig = _parse_signature_line(line)
        verifier = known.get((sig.name, sig.key_id))
        if verifier is None:
            if sig not in unverified:
                unverified.append(sig)
            continue
        if line in checked:
            continue  # the very line again: verified already
        checked.add(line)
        # Every line by a known key must verify (C2SP signed-note), a repeat too: Go's
        # sumdb/note skips repeats unread, so a valid line followed by a forged one under
        # the same name and key id would pass, and what passes would depend on line order.
        verifier.verify(message, sig.signature)
        if (sig.name, sig.key_id) not in seen:
            seen.add((sig.name, sig.key_id))
            verified.append(sig)
    if not verified:
        names = ", ".join(f"{s.name}+{s.key_id:08x}" for s in unverified) or "none"
        trusted = ", ".join(str(v) for v in known.values()) or "none"
        raise SignatureError(
            f"note has no signature by a trusted key (trusted: {trusted}; signed by: {names})"
        )
    return Note(text, tuple(verified), tuple(unverified))
