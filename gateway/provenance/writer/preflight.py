"""What can be known about a provenance log before the gateway opens it for writing.

`owngate config validate` runs this instead of opening the log: the origin line is
valid, each signing key file is private and loads, each witness key parses, no two of the
log's keys (signing, previous, retired) nor a witness key and one of them are two keys
under one name and key id (as the log's open refuses them), no key of the log under
another name than the signing key's (a rotation keeps the name: `one_log_name`), and the log
directory is a writable directory (or can be created) holding no other log, nor less than
the high-water file records (`HighWater.check`: an emptied or older directory that the
gateway would refuse to fork). Nothing is created, locked or written; a log that another
writer holds is only found at start.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gateway.provenance.errors import ProvenanceError
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.cosignature import CosignatureVerifier, unambiguous_witnesses
from gateway.provenance.formats.layout import list_history, read_log_file
from gateway.provenance.formats.note import Verifier
from gateway.provenance.keys import load_signer, one_log_name, unambiguous
from gateway.provenance.writer.high_water import HighWater
from gateway.provenance.writer.recovery import note_text

__all__ = ["preflight"]


def preflight(
    origin: str,
    key_files: Sequence[Path],
    witness_keys: Sequence[str] = (),
    *,
    directory: Path | None,
    high_water: Path | None = None,
    retired_keys: Sequence[str] = (),
) -> list[str]:
    """Every problem that would stop `directory` opening as the log `origin`, signed by
    the keys in `key_files` (`retired_keys` retired), cosigned by `witness_keys`, with its
    newest checkpoint kept in `high_water`; empty when none is found. `directory=None`
    leaves the directory and the high-water file unchecked (they are on another machine)."""
    problems: list[str] = []
    try:
        Checkpoint(origin, 0, bytes(32))
    except ProvenanceError as exc:
        problems.append(f"provenance.origin: {exc}")
    own: list[Verifier] = []  # the log's keys, as `open_log` gathers them
    signing: Verifier | None = None  # the first of `key_files`
    named: list[tuple[str, Verifier]] = []  # the others, each with the setting naming it
    for number, key_file in enumerate(key_files):
        try:
            own.append(load_signer(key_file).verifier())
            if number:
                named.append((f"provenance.previous_signing_key_files ({key_file})", own[-1]))
            else:
                signing = own[-1]
        except OSError as exc:
            problems.append(f"signing key {key_file}: cannot read: {exc.strerror}")
        except ProvenanceError as exc:  # names the file itself
            problems.append(f"signing key {exc}")
    retired = [Verifier(vkey) for vkey in retired_keys]  # parsed at config load
    own += retired
    named += [("provenance.retired_verifier_keys", key) for key in retired]
    witnesses: list[CosignatureVerifier] = []
    for vkey in witness_keys:
        try:
            witnesses.append(CosignatureVerifier(vkey))
        except ProvenanceError as exc:
            problems.append(f"witness key {vkey!r}: {exc}")
    try:  # what `open_log` refuses before it opens the log (exit 3 of `serve`)
        unambiguous(own)
        unambiguous_witnesses(witnesses, own)
    except ProvenanceError as exc:
        problems.append(f"provenance: {exc}")
    if signing is not None:
        try:  # a rotation keeps the key's name, as `open_log` refuses (keys.py)
            one_log_name(signing, named)
        except ProvenanceError as exc:
            problems.append(f"provenance: {exc}")
    if directory is not None:
        try:
            found = _directory(directory, origin)
        except OSError as exc:  # a name past the filesystem's limit: no 500 of the admin API
            found = [f"provenance.dir {directory}: cannot read: {exc.strerror}"]
        if high_water is not None and not found:
            found = _high_water(HighWater(high_water), directory, origin)
        problems += found
    return problems


def _high_water(high_water: HighWater, directory: Path, origin: str) -> list[str]:
    """What `LogStore.open` would refuse for the high-water file (as `serve` without
    --new-log-origin)."""
    try:
        history = list_history(directory) if directory.is_dir() else []
        newest = history[-1][1] if history else None
        # bounded, never waiting on a FIFO, and under an admin candidate's roots
        signed = Checkpoint.parse(note_text(read_log_file(newest), newest)) if newest else None
        high_water.check(directory, origin, signed)
    except ProvenanceError as exc:
        return [f"provenance.high_water_file: {exc}"]
    except OSError as exc:
        return [f"provenance.dir {directory}: cannot read its checkpoints: {exc}"]
    return []


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
        newest = read_log_file(history[-1][1]) if history else None  # as _high_water's
        latest = newest.decode("utf-8").split("\n", 1)[0] if newest is not None else None
    except (OSError, UnicodeDecodeError, ProvenanceError) as exc:
        return [f"provenance.dir {directory}: cannot read its checkpoints: {exc}"]
    if latest is not None and latest != origin:
        return [f"provenance.dir {directory} holds the log {latest!r}, not {origin!r}"]
    return []
