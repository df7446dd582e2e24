"""Signing key files for the provenance log: create (0600, never overwritten) and load.

A key file holds one line, the Go `sumdb/note` signer key string
`PRIVATE+KEY+<name>+<hexid>+<base64(0x01 || seed)>`, so `note.NewSigner` reads it as is.
The matching verifier key string is what auditors get. The file is UTF-8: C2SP signed-note
allows any name without Unicode spaces or '+', and a log's key is named after its origin,
which may be any printable text (`bücher.example/log`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.confined_reads import check_opened
from gateway.provenance.errors import KeyFormatError
from gateway.provenance.formats.note import Signer, Verifier, valid_key_name
from gateway.small_files import read_small_file

__all__ = [
    "MAX_KEYS_FILE",
    "generate_signing_key",
    "load_signer",
    "load_verifiers",
    "one_log_name",
    "write_signing_key",
]

# A key line is about 100 bytes; a file this large is something else named by mistake.
_MAX_KEY_FILE = 4096
MAX_KEYS_FILE = 1 << 20  # a file of verifier keys, one a line


def generate_signing_key(
    name: str, *, random: Callable[[int], bytes] = os.urandom
) -> tuple[str, str]:
    """A fresh Ed25519 key named `name`: (signer key string, verifier key string)."""
    if not valid_key_name(name):
        raise KeyFormatError(f"key name {name!r} is empty or has whitespace or '+'")
    seed = random(32)
    signer = Signer.from_seed(name, seed)
    return signer.skey(seed), signer.vkey


def write_signing_key(
    path: str | os.PathLike[str],
    name: str,
    *,
    random: Callable[[int], bytes] = os.urandom,
) -> str:
    """Write a new signing key file at `path` (mode 0600, refused if it exists).

    Returns the verifier key string to publish to auditors.
    """
    skey, vkey = generate_signing_key(name, random=random)
    target = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags, 0o600)
    except FileExistsError as exc:
        raise FileExistsError(f"{target} already exists; refusing to overwrite a key") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(skey + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        target.unlink()  # no empty or torn key file left to refuse the next attempt
        raise
    directory = os.open(target.parent if str(target.parent) else ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return vkey


def load_signer(path: str | os.PathLike[str]) -> Signer:
    """Read a signing key file written by `write_signing_key` (or Go's note.GenerateKey).

    Raises OSError when the file cannot be opened, KeyFormatError (naming the file, never
    quoting it) when it is not a regular file, is readable by group or others, is larger
    than a key file or does not hold a signer key. At most `_MAX_KEY_FILE` bytes are read,
    and a FIFO or device named by mistake is refused, never waited on.
    """
    target = Path(path)
    # O_NONBLOCK: opening a FIFO for reading must not wait for a writer.
    fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        check_opened(fd, target)  # an admin API candidate's: under its roots
        info = os.fstat(fd)  # of the file opened: no swap between check and read
        if not stat.S_ISREG(info.st_mode):
            raise KeyFormatError(f"{target} is not a regular file")
        if info.st_mode & 0o077:
            raise KeyFormatError(
                f"{target} is readable by group or others "
                f"(mode {info.st_mode & 0o777:o}); chmod 600 it"
            )
        data = os.read(fd, _MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE:
        raise KeyFormatError(f"{target} is larger than a signing key file")
    try:
        return Signer.from_skey(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise KeyFormatError(f"{target} is not a signing key file (not UTF-8 text)") from None
    except KeyFormatError as exc:
        raise KeyFormatError(f"{target}: {exc}") from None


def load_verifiers(keys: list[str]) -> list[Verifier]:
    """Verifier keys given as key strings or as paths of files holding one per line."""
    verifiers: list[Verifier] = []
    for item in keys:
        candidate = Path(item)
        if "+" not in item or candidate.is_file():
            # Bounded and never waiting: a FIFO named by mistake blocked the open for ever,
            # /dev/zero was read until memory ran out (`read_small_file`).
            text = read_small_file(candidate, MAX_KEYS_FILE).decode("utf-8")
            lines = text.splitlines()
            verifiers.extend(Verifier(line) for line in lines if line.strip())
        else:
            verifiers.append(Verifier(item))
    unambiguous(verifiers)
    return verifiers


def unambiguous(verifiers: list[Verifier]) -> None:
    """Refuse two keys under one name and key id: a signature line or a DSSE `keyid`
    names its key only by `name+hexid` (32 bits of SHA-256, which a key holder can make
    collide), so it cannot say which of the two made it, and checking it with either one
    made the verdict depend on the order the keys were given. Go's sumdb/note refuses such
    a set as ambiguous (tests/unit/test_log_key_id_collision.py)."""
    seen: dict[str, Verifier] = {}
    for verifier in verifiers:
        first = seen.setdefault(str(verifier), verifier)
        if first.public_key != verifier.public_key:
            raise KeyFormatError(
                f"verifier keys {first.vkey} and {verifier.vkey} are two keys under one "
                f"name and key id {verifier}: a signature names only those, so which key "
                "made it is ambiguous; trust one of them"
            )


def one_log_name(signing: Verifier, others: Sequence[tuple[str, Verifier]]) -> None:
    """Refuse a key of the log (`others`: each with the setting that names it) under
    another name than the signing key's. A rotation keeps the key's name: in a C2SP
    signed note the key name says whose signature a line is, and a log's key is named
    for its origin, so a checkpoint signed under a new name is another log's to an
    auditor holding both keys (`audit verify --key OLD --key NEW` failed every checkpoint
    the renamed key signed alone). Refused before the log is opened, nothing is written
    under the new name (docs/provenance.md, "Keys")."""
    for where, key in others:
        if key.name != signing.name:
            raise KeyFormatError(
                f"{where} is the key {key}, named {key.name!r}, but the signing key {signing} "
                f"is named {signing.name!r}: a key rotation keeps the key's name (it names "
                "the log: an auditor holding both keys refuses checkpoints signed under "
                "another name as another log's); make the new key under the old name "
                f"(owngate keys new --signing {key.name!r} --key-file NEW.key), or start a "
                "new log (a new provenance.dir and origin)"
            )
