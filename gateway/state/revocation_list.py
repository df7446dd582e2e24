"""This host's list of revoked key digests (`state.revocations_file`): what outlives a
process when Redis is down.

`owngate keys revoke` writes each revocation here, and a gateway writes every one it
makes or learns (from Redis, at a sync); each gateway process reads the list as its state
is built, before its first request, and refuses those keys from then on, Redis up or
down. Before, a process started while Redis was down knew no revocation: a key revoked
through Redis and still listed in gateway.yaml, or in a keys file the revocation did not
clean, was served again.

The file is text, digests only:

    owngate-revoked-keys v1
    sha256:<64 hex>            (one a line, sorted, at most `MAX_DIGESTS`)
    end <count> sha256:<64 hex of every byte above this line>

It is read strictly (`RevocationListError` for anything else: a line that is not a
digest, a wrong count or checksum, a cut-short file, an unreadable one), so a state built
on it fails closed: the gateway refuses to start rather than start without revocations it
had. Written whole under an exclusive `flock` on `.<name>.lock` beside it (one change at
a time across processes): read, union, a temporary file fsynced, renamed over the list,
the directory fsynced. A list that cannot be read is never written over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Final

from gateway.provenance.files import fsync_directory
from gateway.small_files import read_small_file

__all__ = [
    "MAX_DIGESTS",
    "RevocationListError",
    "RevocationListUnavailable",
    "add_revocations",
    "parse_revocations",
    "read_revocations",
    "render_revocations",
]

HEADER: Final = b"owngate-revoked-keys v1"
MAX_DIGESTS: Final = 200_000  # about 14 MB; past it a write is refused (and logged)
_MAX_BYTES: Final = len(HEADER) + 1 + MAX_DIGESTS * 72 + 128
_DIGEST: Final = re.compile(rb"sha256:[0-9a-f]{64}")
_END: Final = re.compile(rb"end (0|[1-9][0-9]{0,6}) (sha256:[0-9a-f]{64})")
# What says the host could not open or read the list now (out of file descriptors or
# memory, interrupted), not that the list is damaged: tried again, the last good list kept.
TRANSIENT_ERRNOS: Final = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN, errno.EINTR}
)
LOCK_WAIT_S: Final = 5.0
_LOCK_POLL_S: Final = 0.02


class RevocationListError(ValueError):
    """The list cannot be read as written (never quoting its bytes), or cannot take more."""


class RevocationListUnavailable(RevocationListError):
    """The list could not be opened or read now for want of a host resource
    (`TRANSIENT_ERRNOS`: `errno_name` says which), not for anything in or about it."""

    def __init__(self, message: str, errno_name: str) -> None:
        super().__init__(message)
        self.errno_name = errno_name


def unavailable(path: Path, exc: OSError) -> RevocationListUnavailable | None:
    """The error a look raises for `exc` when it is transient (`TRANSIENT_ERRNOS`)."""
    if exc.errno not in TRANSIENT_ERRNOS:
        return None
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    return RevocationListUnavailable(f"{path}: cannot be opened now ({name})", name)


def read_revocations(path: Path) -> frozenset[str]:
    """The digests the list at `path` holds; none when there is no file yet. Raises
    `RevocationListError` when it exists but cannot be read or is not a list
    (`RevocationListUnavailable` when the host could not open or read it now)."""
    try:
        raw = read_small_file(path, _MAX_BYTES)
    except FileNotFoundError:
        return frozenset()
    except OSError as exc:  # unreadable, not a regular file, larger than any list
        if (transient := unavailable(path, exc)) is not None:  # or the host out of fds
            raise transient from None
        raise RevocationListError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return parse_revocations(raw, str(path))


def parse_revocations(raw: bytes, where: str) -> frozenset[str]:
    """The digests in a list's bytes (module docstring), or `RevocationListError`."""
    lines = raw.split(b"\n")
    if len(lines) < 3 or lines[0] != HEADER or lines[-1] != b"":
        raise RevocationListError(f"{where}: not an owngate revoked keys list (or cut short)")
    body, end = lines[1:-2], _END.fullmatch(lines[-2])
    for number, line in enumerate(body, 2):
        if not _DIGEST.fullmatch(line):
            raise RevocationListError(
                f"{where}:{number}: not a key digest (sha256: and 64 lowercase hex digits)"
            )
    above = raw[: len(raw) - len(lines[-2]) - 1]
    if end is None or int(end[1]) != len(body) or end[2] != _checksum(above):
        raise RevocationListError(
            f"{where}: its end line does not match what it holds (cut short or edited)"
        )
    return frozenset(line.decode("ascii") for line in body)


def render_revocations(digests: Iterable[str]) -> bytes:
    """The list's bytes for `digests` (each already checked to be one)."""
    above = b"\n".join([HEADER, *sorted(d.encode("ascii") for d in set(digests))]) + b"\n"
    count = above.count(b"\n") - 1
    return above + b"end %d %s\n" % (count, _checksum(above))


def add_revocations(
    path: Path,
    digests: Iterable[str],
    *,
    wait_s: float = LOCK_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Add `digests` to the list at `path` (made if missing); how many were new. Raises
    `RevocationListError` (a list that cannot be read, or would hold more than
    `MAX_DIGESTS`), ValueError for a digest that is none, OSError when it cannot be
    written or its lock was held for `wait_s`."""
    wanted = set(digests)
    if not all(_DIGEST.fullmatch(d.encode("ascii", "replace")) for d in wanted):
        raise ValueError("a revoked keys list holds key digests only (sha256: and 64 hex)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path, wait_s, clock):
        known = read_revocations(path)  # never written over when it cannot be read
        fresh = wanted - known
        if not fresh:
            return 0
        if len(known) + len(fresh) > MAX_DIGESTS:
            raise RevocationListError(f"{path}: would hold more than {MAX_DIGESTS} digests")
        _replace(path, render_revocations(known | fresh))
        return len(fresh)


def _checksum(data: bytes) -> bytes:
    return b"sha256:" + hashlib.sha256(data).hexdigest().encode("ascii")


@contextlib.contextmanager
def _locked(path: Path, wait_s: float, clock: Callable[[], float]) -> Iterator[None]:
    """An exclusive `flock` on `.<name>.lock` beside the list, opened read-only (made 0644
    when missing) so any user who may write the list may take it. Opened without blocking
    and refused (OSError naming it) unless a regular file: a FIFO there held the opening
    thread until a writer came, for good, and with it every write of the list (a revocation
    learned from Redis is enforced only once its write ends: revocation_keeper.py)."""
    lock = path.with_name(f".{path.name}.lock")
    flags = os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(lock, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(lock))
        with contextlib.suppress(PermissionError):  # another user's: readable already
            os.fchmod(fd, 0o644)  # whatever the umask made it: the other user opens it
        deadline = clock() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() >= deadline:
                    raise TimeoutError(f"{lock} was held for {wait_s:g} s") from None
                time.sleep(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the flock


def _replace(path: Path, data: bytes) -> None:
    """Write `data` over `path` atomically and durably (the list's mode kept, 0644 new)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o644  # digests only: readable by the gateway whoever wrote it
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)  # the rename itself outlives a crash
