"""Durable file operations: atomic replace with fsync of the file and of its directory.

A file written here is either absent or complete after a crash: data goes to a temporary
name in the same directory, is fsynced, renamed over the target, and the directory is
fsynced so the rename itself survives power loss.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["fsync_directory", "make_directories", "write_files_atomically"]

_TMP_SUFFIX = ".tmp"


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(path: Path, *, stop: Path) -> None:
    """Create `path` and missing parents up to `stop`, fsyncing each parent that changed."""
    missing: list[Path] = []
    current = path
    while not current.exists() and current != stop and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_directory(directory.parent)


def _create_temporary(temporary: Path) -> int:
    """A new, empty file at `temporary`: one left by a crash is removed first, and what is
    there is never written through (O_EXCL refuses a symlink, even a dangling one, or a
    hard link planted in its place), so a writable log directory cannot turn a write into
    one of another file (say, the signing key)."""
    temporary.unlink(missing_ok=True)  # removes a link itself, never its target
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.open(temporary, flags, 0o644)


def write_files_atomically(files: Iterable[tuple[Path, bytes]], *, root: Path) -> None:
    """Write each (path, data) durably; directories are created under `root` as needed.

    All files are written and fsynced, then renamed, then each touched directory is
    fsynced once, so a batch of N files costs N + (directories) fsyncs.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            make_directories(path.parent, stop=root)
            temporary = path.with_name(path.name + _TMP_SUFFIX)
            fd = _create_temporary(temporary)
            staged.append((temporary, path))
            try:
                view = memoryview(data)
                while view:  # bounded: each write consumes at least one byte or raises
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
        directories: dict[Path, None] = {}
        for temporary, path in staged:
            os.replace(temporary, path)
            directories[path.parent] = None
        for directory in directories:
            fsync_directory(directory)
    except OSError:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise
