"""What can be known about a provenance log before the gateway opens it for writing.

`owngate config validate` runs this instead of opening the log: the origin line is
valid, each signing key file is private and loads, each witness key parses, and the log
directory is a writable directory (or can be created) holding no other log. Nothing is
created, locked or written; a log that another writer holds is only found at start.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gateway.provenance.errors import ProvenanceError
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.cosignature import CosignatureVerifier
from gateway.provenance.formats.layout import list_history
from gateway.provenance.keys import load_signer

__all__ = ["preflight"]


def preflight(
    origin: str,
    key_files: Sequence[Path],
    witness_keys: Sequence[str] = (),
    *,
    directory: Path | None,
) -> list[str]:
    """Every problem that would stop `directory` opening as the log `origin`, signed by
    the keys in `key_files` and cosigned by `witness_keys`; empty when none is found.
    `directory=None` leaves the directory unchecked (it is on another machine)."""
    problems: list[str] = []
    try:
        Checkpoint(origin, 0, bytes(32))
    except ProvenanceError as exc:
        problems.append(f"provenance.origin: {exc}")
    for key_file in key_files:
        try:
            load_signer(key_file)
        except OSError as exc:
            problems.append(f"signing key {key_file}: cannot read: {exc.strerror}")
        except ProvenanceError as exc:  # names the file itself
            problems.append(f"signing key {exc}")
    for vkey in witness_keys:
        try:
            CosignatureVerifier(vkey)
        except ProvenanceError as exc:
            problems.append(f"witness key {vkey!r}: {exc}")
    if directory is not None:
        problems += _directory(directory, origin)
    return problems


def _directory(directory: Path, origin: str) -> list[str]:
    if not directory.exists():
        parent = directory.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            return [f"provenance.dir {directory} does not exist and {parent} is not writable"]
        return []  # created on the first start
    if not directory.is_dir():
        return [f"provenance.dir {directory} is not a directory"]
    if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
        return [f"provenance.dir {directory} is not readable and writable"]
    try:
        history = list_history(directory)
        latest = history[-1][1].read_text(encoding="utf-8").split("\n", 1)[0] if history else None
    except (OSError, UnicodeDecodeError) as exc:
        return [f"provenance.dir {directory}: cannot read its checkpoints: {exc}"]
    if latest is not None and latest != origin:
        return [f"provenance.dir {directory} holds the log {latest!r}, not {origin!r}"]
    return []
