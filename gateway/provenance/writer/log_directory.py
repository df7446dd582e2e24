"""The directory a log store holds: one writer's exclusive lock on it, whether it is still
the directory that was opened, and removing the files a checkpoint has made obsolete.

Once the directory was deleted or replaced (another directory of the same name is there
now), `check_same` raises, so that nothing more is written to the new one by a writer
that recovered the old one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

from gateway.provenance.errors import LogUnavailableError
from gateway.provenance.files import fsync_directory, make_directories
from gateway.provenance.formats.layout import LOCK, WAL
from gateway.provenance.formats.wal import list_segments

__all__ = ["LogDirectory", "unavailable"]


def unavailable(action: str, exc: OSError) -> LogUnavailableError:
    """The error a log store raises when the directory refuses `action`."""
    where = f" ({exc.filename})" if exc.filename else ""
    reason = exc.strerror or str(exc)
    return LogUnavailableError(f"cannot {action} the provenance log: {reason}{where}")


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


class LogDirectory:
    """A log directory locked by this writer (an exclusive `flock` on its lock file)."""

    def __init__(self, path: Path, lock_fd: int, identity: tuple[int, int]) -> None:
        self.path = path
        self._lock_fd = lock_fd
        self._identity = identity  # the directory that was opened

    @classmethod
    def lock(cls, path: Path) -> LogDirectory:
        """Create `path` if needed and take its lock; refused while another writer holds it,
        or once `path` no longer names the directory whose lock file was locked."""
        try:
            make_directories(path, stop=Path(path.anchor))
            directory_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise unavailable("open", exc) from exc
        try:
            return cls._lock_in(path, directory_fd)
        finally:
            os.close(directory_fd)

    @classmethod
    def _lock_in(cls, path: Path, directory_fd: int) -> LogDirectory:
        """The lock file opened in the directory `directory_fd` holds, and that directory's
        identity: the one whose lock is held. Stat'ing `path` after the lock, as before,
        recorded another directory's identity if `path` had been replaced meanwhile (the
        old one renamed away), and `check_same` never noticed that the lock was on the
        old one's lock file."""
        try:
            lock_fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644, dir_fd=directory_fd)
        except OSError as exc:
            raise unavailable("open", exc) from exc
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(lock_fd)
            raise LogUnavailableError(f"{path} is already open by another writer") from exc
        try:
            identity = _identity(os.fstat(directory_fd))
            # Removed or replaced right after the lock was taken (or its search permission
            # taken away): a clear error, and the lock let go, before anything is read.
            if _identity(os.stat(path)) != identity:
                raise OSError(errno.ENOENT, "the directory was replaced", str(path))
        except OSError as exc:
            os.close(lock_fd)
            raise unavailable("open", exc) from exc
        return cls(path, lock_fd, identity)

    def check_same(self) -> None:
        """Raise OSError unless the directory is still the one that was opened."""
        try:
            same = _identity(os.stat(self.path)) == self._identity
        except FileNotFoundError:
            same = False
        if not same:
            raise OSError(errno.ENOENT, "the directory was removed or replaced", str(self.path))

    def remove_covered(self, completed: list[str], covered: int | None) -> None:
        """Drop the segments a checkpoint of size `covered` covers (None: all of them) and
        the partial tiles of the `completed` ones. Snapshots rotate segments, so a segment
        that starts below `covered` holds nothing beyond it."""
        wal = self.path / WAL
        try:
            for first, path in list_segments(wal):
                if covered is None or first < covered:
                    path.unlink()
            if wal.is_dir():
                fsync_directory(wal)
            for name in completed:
                partials = self.path / f"{name}.p"
                if partials.is_dir():
                    shutil.rmtree(partials)
        except OSError as exc:
            # The checkpoint is durable; leftovers are skipped on recovery and retried here.
            raise unavailable("clean up", exc) from exc

    def release(self) -> None:
        """Release the lock (closing its file descriptor releases the flock)."""
        os.close(self._lock_fd)
