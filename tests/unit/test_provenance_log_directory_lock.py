"""Opening a provenance log directory (gateway/provenance/writer/log_directory.py
`LogDirectory.lock`, on `LogStore.open`'s path): a directory whose status cannot be read
right after its lock is taken (removed in between) is refused with the log's own error,
and the lock is let go.

A directory replaced in that moment (renamed away, another made under its name) is refused
too: the lock is on the old directory's lock file, and the identity `check_same` compares
against is the old one's, taken from the directory descriptor the lock file was opened in.
Before, the path was stat'ed after the lock: the new directory's identity was recorded,
and `check_same` never noticed the lock was not on it.

Before, the raw OSError of `os.stat` escaped `LogStore.open` (no `LogUnavailableError`,
which the gateway's start reports as the log being unavailable), and the lock file's
descriptor was never closed: the flock stayed held until the process ended.
"""

from __future__ import annotations

import fcntl
import os
import types
from pathlib import Path

import pytest

from gateway.provenance.errors import LogUnavailableError
from gateway.provenance.formats.layout import LOCK
from gateway.provenance.testing import seeded_signer
from gateway.provenance.writer import log_directory
from gateway.provenance.writer.store import LogStore

ORIGIN = "owngate.test/lock"


def test_a_directory_removed_right_after_its_lock_is_refused_and_the_lock_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, moved = tmp_path / "log", tmp_path / "moved"

    def flock_then_moved(fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)
        if operation & fcntl.LOCK_EX:  # the lock is taken: the directory goes away
            directory.rename(moved)

    # The module's `fcntl` only: the rest of the process keeps the real one.
    patched = types.SimpleNamespace(
        flock=flock_then_moved, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB
    )
    monkeypatch.setattr(log_directory, "fcntl", patched)

    with pytest.raises(LogUnavailableError, match="cannot open the provenance log") as refused:
        LogStore.open(directory, ORIGIN, [seeded_signer(ORIGIN)])
    message = str(refused.value)
    assert "No such file or directory" in message and str(directory) in message

    # The lock was let go: another open of the lock file takes it at once.
    fd = os.open(moved / LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # before: BlockingIOError
    finally:
        os.close(fd)


def test_a_directory_replaced_right_after_its_lock_is_refused_and_the_lock_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, moved = tmp_path / "log", tmp_path / "moved"

    def flock_then_replaced(fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)
        if operation & fcntl.LOCK_EX:  # the lock is taken: another directory takes the name
            directory.rename(moved)
            directory.mkdir()

    patched = types.SimpleNamespace(
        flock=flock_then_replaced, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB
    )
    monkeypatch.setattr(log_directory, "fcntl", patched)

    with pytest.raises(LogUnavailableError, match="the directory was replaced") as refused:
        log_directory.LogDirectory.lock(directory)  # before: locked, the new one's identity
    assert str(directory) in str(refused.value)
    assert not (directory / LOCK).exists()  # nothing was made in the new one

    fd = os.open(moved / LOCK, os.O_RDWR)  # the lock that was taken, let go
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
