"""Reading a small file an operator (or an admin API candidate config) names: bounded.

A key, certificate or key-hash file is a regular file of at most a few megabytes. A FIFO
named by mistake must not block the reader for ever waiting for a writer, and
`/dev/zero` or a multi-gigabyte file must not be read whole into memory: both are refused
with an `OSError` whose `strerror` says why, as an unreadable file's does.
`open_regular_file` is the same opening for a reader that streams a file of any size
(an auditor's body file, hashed in chunks: `provenance.audit.body_file`), and
`read_file_head` reads no more than a parser takes (a receipt or a proof, refused by its
parser when it is longer). `follow=False` refuses a symbolic link too (O_NOFOLLOW), for
a reader of files only the gateway writes (its own log, served by the admin API), where
a link is someone else's doing and would serve whatever it points to.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from gateway.confined_reads import check_opened

__all__ = ["open_regular_file", "read_file_head", "read_small_file"]


def open_regular_file(path: Path, *, follow: bool = True) -> tuple[int, os.stat_result]:
    """A descriptor open for reading on the regular file at `path` (symlinks followed,
    unless `follow` is false) and its status; OSError (the descriptor closed) when it
    cannot be opened or is not a regular file: a FIFO, a device such as `/dev/zero`, a
    directory, a socket, a symbolic link when not followed (ELOOP)."""
    # O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags if follow else flags | os.O_NOFOLLOW)
    except OSError as exc:
        if follow or exc.errno != errno.ELOOP:
            raise
        raise OSError(errno.ELOOP, "a symbolic link, not followed", str(path)) from None
    try:
        check_opened(fd, path)  # an admin API candidate's: under its roots (confined_reads)
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, status


def read_small_file(path: Path, limit: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed unless `follow` is
    false), at most `limit` of them; OSError when it cannot be opened, is not a regular
    file or is larger."""
    fd, status = open_regular_file(path, follow=follow)
    try:
        # A read allocates what it asks for: ask for the size the file says it has (and a
        # byte to see it end), not `limit` (16 MiB for a log's entry bundle) each time.
        want = status.st_size + 1
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # bounded: each read returns at least one byte or ends it
            chunk = os.read(fd, min(limit + 1 - size, max(want - size, 1 << 16)))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return b"".join(chunks)


def read_file_head(path: Path, limit: int) -> bytes:
    """The first `limit` bytes (or fewer: all) of the regular file at `path`, for a
    parser that refuses input of `limit` bytes itself; OSError as `open_regular_file`."""
    fd, _status = open_regular_file(path)
    with os.fdopen(fd, "rb") as file:
        return file.read(limit)
