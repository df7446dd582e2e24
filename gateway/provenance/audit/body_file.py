"""A body file an auditor names (`owngate audit open BODY`, `owngate audit receipt verify
--request-body/--response-body`): hashed as it is read, in chunks, never held whole.

A commitment is SHA-256(domain || salt || SHA-256(body)) (`formats.commitments`), so a
body of any size opens with a running SHA-256 of its bytes. Before, the file was read
whole: a body of many gigabytes (or `/dev/zero`) exhausted memory and a FIFO waited for a
writer for ever. Now the file must be a regular file (a FIFO, device, directory or socket
is an `OSError` saying "not a regular file", as `--key` or `--checkpoint` are), and only
the bytes it held when opened are read, so a file still growing ends too. A file whose
bytes are not the size it said when opened (it shrank or grew while read, was rewritten
in place, or says a size it does not have: `/proc`'s files say 0) is an `OSError`
("changed while it was read"): before, the verdict was on the bytes that happened to be
read, a prefix or a mix, and a `/proc` file opened as an empty body.

What the gateway writes after a stream's bytes (its receipt line, an error event, line
ends: `formats.stream_body`) is looked for in the file's last `TAIL_BYTES`, from the
first line break in them: the gateway's own tail is far shorter (its receipt line is at
most 4/3 of `MAX_RECEIPT_BYTES`), so for the bytes the gateway wrote the candidates are
those of the whole file. A file whose last line alone is longer can only lose
candidates, never gain bytes that are not a prefix of what it holds.
"""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.small_files import open_regular_file

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = ["TAIL_BYTES", "BodyFile", "read_body_file"]

TAIL_BYTES = 1 << 20  # kept in memory: where the gateway's own tail is looked for
_CHUNK = 1 << 20  # one read, hashed before the next


@dataclass(frozen=True, slots=True)
class BodyFile:
    """A body file, as `size` bytes: the SHA-256 state of all but its `tail`, and the
    tail (the whole file when it is short)."""

    size: int
    head: _Hash
    tail: bytes

    def sha256(self, kept: bytes) -> bytes:
        """The SHA-256 of the file's bytes up to the end of `kept`, a prefix of `tail`."""
        if not self.tail.startswith(kept):
            raise ValueError("not a prefix of the body file's tail")
        running = self.head.copy()
        running.update(kept)
        return running.digest()

    def length(self, kept: bytes) -> int:
        """How many of the file's bytes end with `kept`, a prefix of `tail`."""
        return self.size - len(self.tail) + len(kept)


def read_body_file(path: str | Path, tail_bytes: int = TAIL_BYTES) -> BodyFile:
    """The body file at `path`, hashed in chunks of at most 1 MiB, its last `tail_bytes`
    (from just before a line break in them) kept; OSError when it cannot be opened, is
    not a regular file, or changed while it was read (its bytes not the size it said)."""
    fd, status = open_regular_file(Path(path))
    head = hashlib.sha256()
    buffer = memoryview(bytearray(_CHUNK))  # one buffer for every read: no page faults
    try:
        left = status.st_size  # what it held when opened: a growing file ends too
        hashed, parts = 0, []
        while left > 0:  # bounded: each read returns at least one byte or ends it
            got = os.readv(fd, [buffer[: min(_CHUNK, left)]])
            if not got:
                raise _changed(path, "shrank")
            chunk = buffer[:got]
            left -= got
            if left >= tail_bytes:
                head.update(chunk)
                hashed += len(chunk)
                continue
            keep = max(0, len(chunk) - (tail_bytes - left))  # the part past the tail
            head.update(chunk[:keep])
            hashed += keep
            parts.append(bytes(chunk[keep:]))
        if os.read(fd, 1):  # more than it said it held: it grew, or its size is no size
            raise _changed(path, "grew")
        if _version(os.fstat(fd)) != _version(status):  # rewritten in place meanwhile
            raise _changed(path, "was written")
    finally:
        os.close(fd)
    tail = b"".join(parts)
    if hashed:
        # Start the tail a byte before its first line break: the stream_body functions
        # then see a line end where the file has one, never a false start of the body.
        breaks = [at for at in (tail.find(b"\n", 1), tail.find(b"\r", 1)) if at > 0]
        if breaks:
            start = min(breaks) - 1
            head.update(tail[:start])
            hashed, tail = hashed + start, tail[start:]
    return BodyFile(hashed + len(tail), head, tail)


def _version(status: os.stat_result) -> tuple[int, int, int]:
    """What changes when a file's bytes do: its size, modification and change times."""
    return status.st_size, status.st_mtime_ns, status.st_ctime_ns


def _changed(path: str | Path, how: str) -> OSError:
    return OSError(
        errno.EIO,
        f"changed while it was read ({how}; or its size is not what it says): "
        "no verdict on part of it",
        str(path),
    )
