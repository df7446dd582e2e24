"""Appending to a write-ahead segment (`formats.wal`), durably, one synchronous write each.

The log's writer thread holds one `SegmentWriter` for the newest segment; a failed append
(full disk, lost permission) is undone, so the segment always ends with a whole frame or a
torn tail that recovery cuts. An append to a segment that is no longer in the log
directory (the directory was deleted: the open file still takes writes, which nobody will
ever read) fails too: written is not durable unless the log can find it again.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from gateway.provenance.files import fsync_directory

__all__ = ["SegmentWriter"]

_PROBE_BYTES = 4096  # what `SegmentWriter.probe` writes: one page


class SegmentWriter:
    """Appends frames to one segment, each append durable when it returns; undoes a failed
    append.

    The segment is opened with O_DSYNC: a write returns only once its data (and the file
    size it grew to) is on stable storage, as if followed by fdatasync, in one system call.
    The writer thread gives the GIL away for that call, and every extra call is another
    wait for it when the event loop is busy.
    """

    def __init__(self, path: Path, *, valid_bytes: int) -> None:
        self.path = path
        self.valid_bytes = valid_bytes
        self._needs_truncate = False
        existed = path.exists()
        # O_NOFOLLOW: a link planted at a segment's (predictable) name would have this
        # truncate and overwrite its target, say the signing key; such an open fails.
        flags = os.O_WRONLY | os.O_CREAT | os.O_DSYNC | getattr(os, "O_NOFOLLOW", 0)
        self._fd = os.open(path, flags, 0o644)
        try:
            if existed:
                os.ftruncate(self._fd, valid_bytes)
            os.fsync(self._fd)
            if not existed:
                fsync_directory(path.parent)
        except OSError:
            os.close(self._fd)
            if not existed:
                path.unlink(missing_ok=True)
            raise

    def append(self, data: bytes) -> None:
        """Write `data` durably after the valid bytes; on failure nothing is appended."""
        try:
            if self._needs_truncate:
                os.ftruncate(self._fd, self.valid_bytes)
                self._needs_truncate = False
            view = memoryview(data)
            offset = self.valid_bytes
            while view:  # bounded: each pwrite consumes at least one byte or raises
                written = os.pwrite(self._fd, view, offset)
                view = view[written:]
                offset += written
            if os.fstat(self._fd).st_nlink == 0:  # one more system call per batch
                raise OSError(errno.ENOENT, "the segment was removed", str(self.path))
        except OSError:
            self._needs_truncate = True
            try:
                os.ftruncate(self._fd, self.valid_bytes)
                self._needs_truncate = False
            except OSError:
                pass  # retried before the next append; the error below is what matters
            raise
        self.valid_bytes += len(data)

    def probe(self) -> None:
        """Raise the OSError an append would raise now (full disk, lost permission),
        appending nothing: a block of zeros is written durably where the next frame goes,
        then cut off, as a failed append is. A crash in between leaves a torn tail, which
        recovery cuts."""
        self.append(bytes(_PROBE_BYTES))  # a failure is undone (or left to undo) there
        self.valid_bytes -= _PROBE_BYTES
        self._needs_truncate = True
        self._cut()  # durable too, should a snapshot close this segment

    def close(self, *, cut: bool = True) -> None:
        """Close the segment, first cutting off what a failed write may have left after the
        valid bytes (a segment that is not the last must end with a whole frame). If that
        cut fails, the OSError is raised and the segment stays open, to be tried again.
        `cut=False` closes without it: for the last segment, whose torn tail recovery
        cuts."""
        if cut and self._needs_truncate:
            self._cut()
        os.close(self._fd)

    def _cut(self) -> None:
        """Cut the file back to its valid bytes, durably."""
        os.ftruncate(self._fd, self.valid_bytes)
        os.fsync(self._fd)
        self._needs_truncate = False
