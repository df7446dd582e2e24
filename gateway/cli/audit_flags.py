"""What the `owngate audit` verbs share: environment defaults, the key and URL flags, exit
codes for failed checks, and the local copy of a log given as a URL."""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from gateway.provenance import (
    ProvenanceError,
    Verifier,
    load_verifiers,
)
from gateway.provenance.audit.pinned import is_spki_pin
from gateway.provenance.audit.remote import FetchLimits, is_url, mirror_log
from gateway.provenance.audit.shown import MAX_SHOWN_MESSAGE, shown
from gateway.provenance.formats.attestation import one_key_per_backend
from gateway.provenance.formats.cosignature import CosignatureVerifier
from gateway.provenance.formats.layout import MAX_HISTORY, MAX_NOTE_FILE
from gateway.provenance.keys import MAX_KEYS_FILE
from gateway.small_files import read_small_file

__all__ = [
    "Handler",
    "backend_keys",
    "backend_pins",
    "env",
    "env_list",
    "fetch_limits",
    "guarded",
    "key_flag",
    "local_log",
    "max_checkpoints_flag",
    "saved_checkpoint",
    "token_flag",
    "trusted_keys",
    "unverified_size",
    "usage",
    "witness_key",
]


def env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"OWNGATE_AUDIT_{name}", default)


def env_list(name: str) -> list[str]:
    value = env(name) or ""
    return [item for item in value.replace(",", " ").split() if item]


Handler = Callable[[argparse.Namespace], int]


def guarded(handler: Handler) -> Handler:
    """Failed checks exit 1 with their reason; unreadable input exits 2. The reason is
    printed through `shown`: it may quote what the artefact under audit says."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ProvenanceError as exc:
            print(f"FAILED: {shown(exc, MAX_SHOWN_MESSAGE)}", file=sys.stderr)
            return 1
        except (OSError, ValueError) as exc:
            print(f"error: {shown(exc, MAX_SHOWN_MESSAGE)}", file=sys.stderr)
            return 2

    return run


def usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def key_flag(parser: argparse.ArgumentParser, *, required: bool) -> None:
    defaults = env_list("KEY")
    parser.add_argument(
        "--key",
        action="append",
        default=None,
        required=required and not defaults,
        metavar="VKEY",
        help="trusted verifier key (name+hexid+base64) or a file of them; repeat for "
        "rotated keys (env OWNGATE_AUDIT_KEY)",
    )
    parser.set_defaults(_key_defaults=defaults)


def trusted_keys(args: argparse.Namespace) -> list[Verifier]:
    return load_verifiers(args.key or args._key_defaults)


def max_checkpoints_flag(parser: argparse.ArgumentParser, folders: str) -> None:
    """`--max-checkpoints`: how many files of the log's `folders` an audit lists at most
    (the operator under audit may have padded them with millions)."""
    parser.add_argument(
        "--max-checkpoints",
        type=int,
        default=int(env("MAX_CHECKPOINTS", str(MAX_HISTORY)) or MAX_HISTORY),
        metavar="N",
        help=f"read at most N files in {folders}; more fails the audit rather than exhaust "
        f"memory (env OWNGATE_AUDIT_MAX_CHECKPOINTS, default {MAX_HISTORY})",
    )


def token_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token",
        default=env("TOKEN"),
        help="with a URL: the bearer token to send (an owngate admin token with the "
        "auditor role; env OWNGATE_AUDIT_TOKEN)",
    )
    parser.add_argument(
        "--max-download",
        type=int,
        default=env("MAX_DOWNLOAD", str(FetchLimits().max_bytes)),  # type= converts it
        metavar="BYTES",
        help="with a URL: copy at most this many bytes in all (default 16 GiB; never more "
        "than the checkpoint's tree size can hold; env OWNGATE_AUDIT_MAX_DOWNLOAD)",
    )
    parser.add_argument(
        "--file-deadline",
        type=float,
        default=env("FILE_DEADLINE", str(FetchLimits().file_deadline_s)),
        metavar="SECONDS",
        help="with a URL: each file must arrive whole within this (default 300; "
        "env OWNGATE_AUDIT_FILE_DEADLINE)",
    )
    parser.add_argument(
        "--copy-deadline",
        type=float,
        default=env("COPY_DEADLINE", str(FetchLimits().copy_deadline_s)),
        metavar="SECONDS",
        help="with a URL: the whole copy must be done within this (default 3600; "
        "env OWNGATE_AUDIT_COPY_DEADLINE)",
    )


def fetch_limits(args: argparse.Namespace) -> FetchLimits:
    return FetchLimits(
        file_deadline_s=args.file_deadline,
        copy_deadline_s=args.copy_deadline,
        max_bytes=args.max_download,
    )


@contextlib.contextmanager
def local_log(
    location: str,
    args: argparse.Namespace,
    verifiers: Sequence[Verifier] = (),
    origin: str | None = None,
) -> Iterator[str]:
    """A log directory for `location`: itself, or for an http(s) URL serving a log as
    C2SP tlog-tiles, a temporary copy of what its checkpoint covers (with `verifiers`,
    one that checkpoint is signed by)."""
    if not is_url(location):
        yield location
        return
    with tempfile.TemporaryDirectory(prefix="owngate-audit-") as copy:
        mirror_log(
            location,
            Path(copy),
            token=args.token,
            verifiers=verifiers,
            origin=origin,
            limits=fetch_limits(args),
        )
        yield copy


def backend_keys(items: list[str], log_keys: Sequence[Verifier]) -> dict[str, Verifier]:
    """`ID=VKEY` items (a VKEY may be a file holding the key) as backend id -> verifier.
    ValueError for an ID given twice, one key for two IDs, or a key of the log itself
    (`log_keys`, under any name): a backend "countersigning" with the log's key is the
    gateway's word twice."""
    own = {_public_key(verifier) for verifier in log_keys}
    keys: dict[str, Verifier] = {}
    for item in items:
        backend, sep, key = item.partition("=")
        if not sep or not backend or not key:
            raise ValueError(f"--backend-key wants ID=VKEY, not {item!r}")
        found = load_verifiers([key])
        if len(found) != 1:
            raise ValueError(f"--backend-key {backend}: give exactly one key")
        if backend in keys:
            raise ValueError(f"--backend-key {backend} is given twice: give it one key")
        if _public_key(found[0]) in own:
            raise ValueError(
                f"--backend-key {backend} is a key of the log itself: whoever signs the log "
                "would sign its countersignatures too; give the sidecar's own key"
            )
        keys[backend] = found[0]
    one_key_per_backend(keys)
    return keys


def backend_pins(items: list[str]) -> dict[str, frozenset[str]]:
    """`ID=PIN` items as backend id -> its pins: `PIN` as `tls.pin_spki_sha256` writes
    it. An ID may be given several times, one pin each (the keys of a rotation); a PIN
    of another shape is a ValueError, so a mistyped pin never passes for "no pin"."""
    pins: dict[str, set[str]] = {}
    for item in items:
        backend, sep, pin = item.partition("=")
        if not sep or not backend or not pin:
            raise ValueError(f"--backend-pin wants ID=PIN, not {item!r}")
        if not is_spki_pin(pin):
            raise ValueError(
                f"--backend-pin {backend}: {pin!r} is not a key pin: give sha256// followed "
                "by the standard base64 of 32 bytes, as tls.pin_spki_sha256 and `owngate "
                "backend cert` write it"
            )
        pins.setdefault(backend, set()).add(pin)
    return {backend: frozenset(held) for backend, held in pins.items()}


def _public_key(verifier: Verifier) -> bytes:
    """The key bytes of a verifier key (`name+hexid+base64`), whatever its name."""
    return base64.b64decode(verifier.vkey.split("+", 2)[2])  # the base64 may hold "+"


def saved_checkpoint(name: str) -> bytes:
    """A checkpoint the auditor saw before (`--checkpoint`, `--attest-checkpoint`): a
    regular file of at most a note's size, opened without waiting (a FIFO blocked the
    audit for ever, `/dev/zero` was read until memory ran out); OSError (exit 2) else."""
    return read_small_file(Path(name), MAX_NOTE_FILE)


def witness_key(text: str) -> CosignatureVerifier:
    """A witness key given directly, or the first key line of a file (read as `--key`'s
    file is: a regular file of at most 1 MiB, opened without waiting; OSError else)."""
    if "+" not in text or Path(text).is_file():
        content = read_small_file(Path(text), MAX_KEYS_FILE).decode("utf-8")
        lines = [line.strip() for line in content.splitlines()]
        text = next((line for line in lines if line and not line.startswith("#")), "")
    return CosignatureVerifier(text)


def unverified_size(note: bytes) -> int:
    """Tree size of a checkpoint note before any key check (the verifier checks later)."""
    lines = note.decode("utf-8", "replace").split("\n")
    if len(lines) < 3 or not lines[1].isdecimal():
        raise ProvenanceError("the log's checkpoint file is not a checkpoint")
    return int(lines[1])
