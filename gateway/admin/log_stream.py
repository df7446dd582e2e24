"""A large log file (an entry bundle, up to 16 MiB) answered as its client takes it
(`OpenLogFile`, `StreamedLogFile`).

The log's files were read whole and handed to uvicorn in one write: the read pool
(gateway/admin/work.py) bounded the reads in flight, not the bytes left in each
connection's transport for a client that reads slowly or not at all. 32 admin
connections each asking for a 16 MiB bundle and reading nothing held some 500 MB in the
gateway until `write_timeout_s` cut them off, whoever sent them (any auditor token).

Now a file longer than `CHUNK` is opened in a log-read thread (its turn taken there, as
any read's) and streamed from the open descriptor: each later chunk is read in the same
threads (`AdminWork.more`, no turn of its own) and sent through uvicorn's `send`, which
waits while the connection's transport has paused writing (its buffer past the
high-water mark). A slow or silent client holds one chunk read ahead and its transport's
buffer, the high-water mark plus one chunk: about `3 * CHUNK`, not the file. One that
reads nothing is still cut off after `write_timeout_s` (gateway/listener.py), and at the
connection cap it is dropped first for a newcomer (gateway/listener_room.py).

The writer replaces a log file by renaming a new one over it (never in place), so the
open descriptor reads one version whole, the one whose size the `content-length` says.
A file that reads shorter than its size anyway ends the connection (the answer cannot
be finished). A HEAD (gateway/admin/headers.py `HEAD_ONLY`) gets the head alone, no
chunk read past the first: it read the file through, a loop turn and a thread's read per
chunk, for a body dropped. The descriptor is closed when the answer ends, however it
ends; a chunk's read in a thread at that moment closes it itself once done (`close`), so
the loop never waits on a disk and no descriptor number is reused under a running read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.admin.headers import HEAD_ONLY
from gateway.admin.work import AdminWork
from gateway.provenance.formats.layout import open_log_file

__all__ = ["CHUNK", "OpenLogFile", "StreamedLogFile", "open_streamed"]

CHUNK: Final = 64 * 1024  # read and sent at a time; a file this long or shorter is sent whole


class OpenLogFile:
    """A log file open for streaming: its `size`, its `first` chunk (read when it was
    opened) and `read(offset)` for each next one (in a thread); `close()` once done."""

    __slots__ = ("_closed", "_fd", "_lock", "_reading", "first", "path", "size")

    def __init__(self, fd: int, size: int, first: bytes, path: Path) -> None:
        self._fd, self.size, self.first, self.path = fd, size, first, path
        self._lock = threading.Lock()  # held for flag changes only, never across a read
        self._reading = False
        self._closed = False

    def read(self, offset: int) -> bytes:
        """The chunk at `offset` (in a thread); empty once closed."""
        with self._lock:
            if self._closed:
                return b""
            self._reading = True
        try:
            return os.pread(self._fd, min(CHUNK, self.size - offset), offset)
        finally:
            with self._lock:
                self._reading = False
                if self._closed:  # closed while this read ran: the descriptor is ours to close
                    os.close(self._fd)

    def close(self) -> None:
        """Close the descriptor now, or (a read running) when that read is done."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._reading:
                os.close(self._fd)


def open_streamed(path: Path, limit: int) -> bytes | OpenLogFile:
    """The log file at `path` (a regular file of at most `limit` bytes, never through a
    symbolic link): its bytes when it is `CHUNK` long or shorter, else open for streaming
    with its first chunk read. Raises as `open_log_file`."""
    fd, size = open_log_file(path, limit, follow=False)
    try:
        first = os.pread(fd, CHUNK + 1 if size <= CHUNK else CHUNK, 0)
    except BaseException:
        os.close(fd)
        raise
    if size <= CHUNK:
        os.close(fd)
        return first[:size]  # a file that grew past its size has no more for this answer
    return OpenLogFile(fd, size, first, path)


class StreamedLogFile(StreamingResponse):
    """The answer of an `OpenLogFile`: its size as `content-length`, its chunks sent as
    the client takes them (see the module docstring), the file closed at its end."""

    def __init__(
        self, opened: OpenLogFile, reads: AdminWork, media_type: str, headers: Mapping[str, str]
    ) -> None:
        self._opened = opened
        super().__init__(
            _chunks(opened, reads),
            media_type=media_type,
            headers={**headers, "content-length": str(opened.size)},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope.get(HEAD_ONLY):  # a HEAD: its body would be dropped, so none is read
                start = {"status": self.status_code, "headers": self.raw_headers}
                await send({"type": "http.response.start", **start})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await super().__call__(scope, receive, send)
        finally:
            self._opened.close()


async def _chunks(opened: OpenLogFile, reads: AdminWork) -> AsyncIterator[bytes]:
    yield opened.first
    offset = len(opened.first)
    while offset < opened.size:  # bounded: each chunk read is at least a byte, or it ends
        chunk = await reads.more(opened.read, offset)
        if not chunk:
            raise OSError(f"{opened.path.name}: shorter than its {opened.size} bytes")
        yield chunk
        offset += len(chunk)
