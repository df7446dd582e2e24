"""Reads confined to a set of roots, checked on the file each read opened (the admin API's
candidate configs: `gateway.admin.candidate_files`).

A candidate config's paths are checked against the roots before validation reads them,
and each is read a moment later: someone who may write under a root could swap a checked
file for a link to any file between the two. Inside `confined(roots)`, every file the
gateway's readers open (`small_files.open_regular_file`, a signing key, the high-water
file) is checked once it is open: the path the open descriptor refers to
(`/proc/self/fd/N`, every link already followed by the kernel) must lie under a root, else
the read is an OSError saying so and nothing of the file is read. The check is of the
descriptor the bytes are then read from, so no later swap changes what is read. A hard
link under a root is under it (the kernel names the file by the path it was opened by;
docs/security.md says what `fs.protected_hardlinks` leaves of that).

The roots live in a `ContextVar`: one validation's, in the thread that runs it, never
another request's; outside `confined` (serving, the CLI) nothing is checked.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["OUTSIDE", "UNKNOWN", "check_opened", "confined", "within"]

# The roots of the validation running in this context; None outside one (checks nothing).
_ROOTS: ContextVar[tuple[str, ...] | None] = ContextVar("confined_read_roots", default=None)

OUTSIDE = "outside the files this gateway reads (a link swapped in after the check?)"
# Where the kernel cannot say which file a descriptor is (no /proc mounted): nothing is
# read on trust, and the answer says why, not that a link was swapped in.
UNKNOWN = "not read: which file was opened cannot be told without /proc/self/fd"


@contextmanager
def confined(roots: Sequence[str]) -> Iterator[None]:
    """Within the block, `check_opened` refuses a file that is not under one of `roots`
    (real paths: every link resolved)."""
    token = _ROOTS.set(tuple(roots))
    try:
        yield
    finally:
        _ROOTS.reset(token)


def check_opened(fd: int, path: object) -> None:
    """Raise OSError (EACCES, naming `path`) when a confined read is running and `fd`,
    a descriptor just opened for `path`, refers to a file under none of its roots (or to
    one whose path the kernel cannot say: no /proc)."""
    roots = _ROOTS.get()
    if roots is None:
        return
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        raise OSError(errno.EACCES, UNKNOWN, str(path)) from None  # never read on trust
    if not opened.startswith(os.sep) or not any(within(opened, root) for root in roots):
        raise OSError(errno.EACCES, OUTSIDE, str(path))


def within(path: str, root: str) -> bool:
    """Whether the real path `path` is `root` or under it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
