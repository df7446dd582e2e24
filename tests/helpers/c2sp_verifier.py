"""An auditor's own verifier of a C2SP transparency log, written from the public specs
alone (C2SP signed-note, tlog-checkpoint, tlog-tiles and tlog-proof; RFC 6962 / RFC 9162
§2.1 Merkle trees and proofs). It imports nothing of `gateway`, so it checks owngate's
log as any other tlog-tiles client would (tests/unit/test_c2sp_verifier.py runs it on
the shared vectors, tests/integration/test_c2sp_audit.py on a gateway's log).

Every check raises `Rejected` with the reason; nothing here returns a bool. The Merkle
tree math is in tests/helpers/c2sp_merkle.py (re-exported here).
`tests/helpers/independent_audit.py` reads the same files more leniently, to check what
a receipt and a client's bytes say; this module is the strict reading of the formats.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.helpers.c2sp_merkle import (
    HASH,
    Rejected,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)

__all__ = [
    "COSIGNATURE",
    "ED25519",
    "Checkpoint",
    "NoteKey",
    "Rejected",
    "consistency_proof",
    "from_directory",
    "from_url",
    "inclusion_proof",
    "leaf_hash",
    "note_key",
    "open_checkpoint",
    "open_note",
    "read_log",
    "root_of",
    "tile_path",
    "verify_consistency",
    "verify_inclusion",
    "verify_tlog_proof",
]

WIDTH = 256  # hashes in a full tile, entries in a full bundle (tlog-tiles)
MAX_SIGNATURES = 100  # signed-note: verifiers SHOULD cap them, and MUST accept 16
Fetch = Callable[[str], bytes]


# --- signed-note ----------------------------------------------------------------------


ED25519, COSIGNATURE = 0x01, 0x04  # signed-note signature types


@dataclass(frozen=True)
class NoteKey:
    """An Ed25519 verifier key, `name+hex(key id)+base64(type || public key)`: a note
    signer's (type 0x01) or a witness's (0x04, C2SP tlog-cosignature)."""

    name: str
    key_id: bytes
    public: Ed25519PublicKey
    kind: int = ED25519

    def verify(self, blob: bytes, text: bytes) -> int | None:
        """Check one signature line's bytes (key id stripped) over the note text; the
        cosignature's timestamp for a witness key. Raises `Rejected`."""
        message, timestamp = text, None
        if self.kind == COSIGNATURE:
            if len(blob) != 8 + 64:
                raise Rejected(f"cosignature by {self.name} is not 72 bytes")
            timestamp, blob = int.from_bytes(blob[:8], "big"), blob[8:]
            if timestamp >= 1 << 63:
                raise Rejected(f"cosignature by {self.name}: timestamp past 2^63 - 1")
            message = b"cosignature/v1\ntime %d\n" % timestamp + text
        try:
            self.public.verify(blob, message)
        except InvalidSignature as error:
            raise Rejected(f"invalid signature by {self.name}+{self.key_id.hex()}") from error
        return timestamp


def _valid_name(name: str) -> bool:
    return bool(name) and "+" not in name and not any(c.isspace() for c in name)


def note_key(vkey: str) -> NoteKey:
    name, _, rest = vkey.partition("+")
    hexid, _, encoded = rest.partition("+")
    if not _valid_name(name) or not re.fullmatch(r"[0-9a-fA-F]{8}", hexid):
        raise Rejected(f"malformed verifier key {vkey!r}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except binascii.Error as error:
        raise Rejected(f"verifier key {vkey!r}: bad base64") from error
    if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE):
        raise Rejected(f"verifier key {vkey!r}: not an Ed25519 (0x01 or 0x04) key")
    key_id = hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4]
    if key_id != bytes.fromhex(hexid):
        raise Rejected(f"verifier key {vkey!r}: key id does not match the key")
    return NoteKey(name, key_id, Ed25519PublicKey.from_public_bytes(raw[1:]), raw[0])


def open_note(note: bytes, keys: Sequence[NoteKey]) -> tuple[bytes, list[NoteKey]]:
    """The note's text and the known keys whose signatures verified (a witness key's:
    its tlog-cosignature). Lines by unknown keys (name or key id differing) are ignored;
    any line by a known key must verify; at least one must."""
    try:
        decoded = note.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Rejected("note is not valid UTF-8") from error
    if any(ord(c) < 0x20 and c != "\n" for c in decoded):
        raise Rejected("note holds an ASCII control character other than newline")
    split = note.rfind(b"\n\n")
    if split < 0:
        raise Rejected("note has no blank line before its signatures")
    text, signatures = note[: split + 1], note[split + 2 :]
    if not signatures.endswith(b"\n"):
        raise Rejected("note's signatures do not end in a newline")
    lines = signatures[:-1].split(b"\n")
    if len(lines) > MAX_SIGNATURES:
        raise Rejected(f"note has more than {MAX_SIGNATURES} signatures")
    verified: list[NoteKey] = []
    for line in lines:
        if not line.startswith("\u2014 ".encode()):
            raise Rejected(f"not a signature line: {line[:80]!r}")
        name, space, encoded = line[4:].decode().partition(" ")
        try:
            blob = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            blob = b""
        if not space or not _valid_name(name) or len(blob) < 5:
            raise Rejected(f"malformed signature line: {line[:80]!r}")
        for key in keys:
            if key.name == name and key.key_id == blob[:4]:
                key.verify(blob[4:], text)
                verified.append(key)
    if not verified:
        raise Rejected("note is not signed by any trusted key")
    return text, verified


# --- tlog-checkpoint ------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()


def parse_checkpoint(text: bytes) -> Checkpoint:
    lines = text.decode().split("\n")
    if lines[-1] != "" or len(lines) < 4 or any(not line for line in lines[:-1]):
        raise Rejected("checkpoint text is not three or more non-empty lines")
    origin, size, root, *extensions = lines[:-1]
    if not re.fullmatch(r"0|[1-9][0-9]*", size):
        raise Rejected(f"checkpoint tree size {size!r} is not decimal without leading zeros")
    try:
        root_hash = base64.b64decode(root, validate=True)
    except binascii.Error as error:
        raise Rejected("checkpoint root hash is not base64") from error
    if len(root_hash) != HASH:
        raise Rejected(f"checkpoint root hash is {len(root_hash)} bytes, not {HASH}")
    return Checkpoint(origin, int(size), root_hash, tuple(extensions))


def open_checkpoint(note: bytes, keys: Sequence[NoteKey], origin: str | None = None) -> Checkpoint:
    """A signed checkpoint, its origin `origin` when given (else its signer's name)."""
    text, signers = open_note(note, keys)
    logs = [key for key in signers if key.kind == ED25519]
    if not logs:
        raise Rejected("checkpoint carries no verified signature by a log key")
    checkpoint = parse_checkpoint(text)
    expected = origin if origin is not None else logs[0].name
    if checkpoint.origin != expected:
        raise Rejected(f"checkpoint origin {checkpoint.origin!r} is not {expected!r}")
    return checkpoint


# --- tlog-tiles -----------------------------------------------------------------------


def _index(n: int) -> str:
    groups = [f"{n % 1000:03d}"]
    while n >= 1000:
        n //= 1000
        groups.insert(0, f"x{n % 1000:03d}")
    return "/".join(groups)


def tile_path(level: int | str, n: int, width: int = WIDTH) -> str:
    """`tile/<L>/<N>[.p/<W>]`; level `"entries"` names an entry bundle."""
    return f"tile/{level}/{_index(n)}" + (f".p/{width}" if width < WIDTH else "")


def from_directory(root: Path) -> Fetch:
    def fetch(path: str) -> bytes:
        try:
            return (root / path).read_bytes()
        except OSError as error:
            raise Rejected(f"{path}: missing ({error.strerror})") from error

    return fetch


def from_url(prefix: str, token: str | None = None) -> Fetch:
    """Fetch from a tlog-tiles prefix over HTTP (`prefix` ends in `/`)."""

    def fetch(path: str) -> bytes:
        request = urllib.request.Request(prefix + path)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body: bytes = response.read(WIDTH * 65537 + 1)
                return body
        except urllib.error.HTTPError as error:
            raise Rejected(f"{path}: HTTP {error.code}") from error

    return fetch


def _bundle(data: bytes, width: int, path: str) -> list[bytes]:
    entries, at = [], 0
    for i in range(width):
        if at + 2 > len(data):
            raise Rejected(f"{path}: cut short at entry {i} of {width}")
        length = int.from_bytes(data[at : at + 2], "big")
        if at + 2 + length > len(data):
            raise Rejected(f"{path}: entry {i} is cut short")
        entries.append(data[at + 2 : at + 2 + length])
        at += 2 + length
    if at != len(data):
        raise Rejected(f"{path}: {len(data) - at} bytes after its {width} entries")
    return entries


def _tile(fetch: Fetch, level: int | str, n: int, width: int) -> tuple[str, bytes, int]:
    """A tile or bundle: its path, its bytes and the width they hold. A partial one no
    longer there is read from the full one that replaced it (tlog-tiles lets a log
    delete it then); the caller takes the first `width` of its 256."""
    path = tile_path(level, n, width)
    try:
        return path, fetch(path), width
    except Rejected as missing:
        if width == WIDTH:
            raise
        try:
            return tile_path(level, n), fetch(tile_path(level, n)), WIDTH
        except Rejected:
            raise Rejected(f"{path}: missing, and no full tile replaces it") from missing


def read_log(
    fetch: Fetch, keys: Sequence[NoteKey], origin: str | None = None, note: bytes | None = None
) -> tuple[Checkpoint, list[bytes]]:
    """The signed checkpoint (`note`, else the log's `checkpoint`) and every entry it
    covers, read from the entry bundles; the root recomputed from them, and every hash
    tile its size needs equal to the recomputed one (full tiles at `tile/<L>/<N>`, the
    partial ones at `.p/<W>`, exactly W hashes)."""
    checkpoint = open_checkpoint(note if note is not None else fetch("checkpoint"), keys, origin)
    size = checkpoint.size
    entries: list[bytes] = []
    for n in range(-(-size // WIDTH)):
        width = min(WIDTH, size - n * WIDTH)
        path, data, held = _tile(fetch, "entries", n, width)
        entries.extend(_bundle(data, held, path)[:width])
    level_hashes = [leaf_hash(entry) for entry in entries]
    if root_of(level_hashes) != checkpoint.root:
        raise Rejected("the entries do not hash to the checkpoint's root")
    level = 0
    while level_hashes:
        for n in range(-(-len(level_hashes) // WIDTH)):
            want = level_hashes[n * WIDTH : (n + 1) * WIDTH]
            path, data, held = _tile(fetch, level, n, len(want))
            if len(data) != held * HASH or data[: len(want) * HASH] != b"".join(want):
                raise Rejected(f"{path}: not the tile the entries hash to")
        level_hashes = [
            root_of(level_hashes[k : k + WIDTH])
            for k in range(0, len(level_hashes) - WIDTH + 1, WIDTH)
        ]
        level += 1
    return checkpoint, entries


# --- tlog-proof -----------------------------------------------------------------------


def verify_tlog_proof(
    proof: bytes,
    keys: Sequence[NoteKey],
    origin: str | None = None,
    leaf: bytes | None = None,
) -> tuple[int, Checkpoint, bytes | None]:
    """A `c2sp.org/tlog-proof@v1` file: its index, checkpoint and `extra` data. The leaf
    proved is `leaf` when given, else the leaf hash of the extra data."""
    head, blank, note = proof.partition(b"\n\n")
    if not blank:
        raise Rejected("tlog-proof: no blank line before the checkpoint")
    try:
        lines = head.decode().split("\n")
    except UnicodeDecodeError as error:
        raise Rejected("tlog-proof: not UTF-8") from error
    if lines[0] != "c2sp.org/tlog-proof@v1":
        raise Rejected("tlog-proof: first line is not c2sp.org/tlog-proof@v1")
    extra = None
    rest = lines[1:]
    if rest and rest[0].startswith("extra "):
        try:
            extra = base64.b64decode(rest[0][6:], validate=True)
        except binascii.Error as error:
            raise Rejected("tlog-proof: extra is not base64") from error
        rest = rest[1:]
    found = re.fullmatch(r"index (0|[1-9][0-9]*)", rest[0] if rest else "")
    if not found:
        raise Rejected("tlog-proof: no index line")
    hashes = []
    for line in rest[1:]:
        try:
            hashes.append(base64.b64decode(line, validate=True))
        except binascii.Error as error:
            raise Rejected(f"tlog-proof: proof line {line!r} is not base64") from error
        if len(hashes[-1]) != HASH:
            raise Rejected(f"tlog-proof: proof line {line!r} is not a SHA-256 hash")
    checkpoint = open_checkpoint(note, keys, origin)
    if leaf is None:
        if extra is None:
            raise Rejected("tlog-proof: no extra data and no leaf given: it proves nothing")
        leaf = leaf_hash(extra)
    index = int(found.group(1))
    verify_inclusion(leaf, index, checkpoint.size, hashes, checkpoint.root)
    return index, checkpoint, extra
