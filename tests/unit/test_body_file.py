"""`audit.body_file`: a body file hashed as it is read, its tail kept to find what the
gateway wrote after a stream's bytes. For every tail the gateway writes, the bodies a
commitment may be to are those of the file read whole, whatever the tail kept."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.provenance.audit.body_file import read_body_file
from gateway.provenance.formats.stream_body import committed_bodies, countersigned_body

RECEIPT = b": owngate-receipt QUJDRA==\n\n"
ERROR = b'data: {"error":{"message":"upstream broke off","type":"upstream_error"}}\n\n'
BACKENDS = [
    b"",
    b"data: one\n\n",
    b"data: one\n\ndata: two",  # ended mid-line: the gateway writes an LF
    b"data: one\n\ndata: two\n",
    b"data: " + b"y" * 300 + b"\n\n",  # a last line longer than the tail kept
    b"x" * 500,  # no line break at all
    b"data: a\r\n\r\ndata: b\r",
]
TAILS = [b"", RECEIPT, b"\n" + RECEIPT, ERROR + RECEIPT, b"\n" + ERROR + RECEIPT]


def _digests(path: Path, form: str, tail_bytes: int) -> list[tuple[int, bytes]]:
    body = read_body_file(path, tail_bytes)
    kept = committed_bodies(body.tail) if form == "stream" else (countersigned_body(body.tail),)
    return [(body.length(k), body.sha256(k)) for k in kept]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("tail_bytes", [1, 2, 3, 160, 200, 1 << 20])
def test_the_candidates_are_those_of_the_file_read_whole(
    tmp_path: Path, backend: bytes, tail: bytes, tail_bytes: int
) -> None:
    path = tmp_path / "body"
    received = backend + tail
    path.write_bytes(received)
    whole = [(len(c), hashlib.sha256(c).digest()) for c in committed_bodies(received)]
    streamed = _digests(path, "stream", tail_bytes)
    single = _digests(path, "countersigned", tail_bytes)
    for length, digest in [*streamed, *single]:  # whatever is kept: a prefix of the file
        assert digest == hashlib.sha256(received[:length]).digest()
    if tail_bytes > len(tail) + 2:  # the gateway's tail fits: the same, in the same order
        assert streamed == whole
        assert single == whole[:1]


def test_the_file_is_read_no_further_than_its_size_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "body"
    path.write_bytes(b"a" * 10)
    body = read_body_file(path, 4)
    assert body.size == 10 and body.tail == b"aaaa"
    assert body.sha256(body.tail) == hashlib.sha256(b"a" * 10).digest()
    assert body.sha256(b"aa") == hashlib.sha256(b"a" * 8).digest()
    with pytest.raises(ValueError, match="not a prefix"):
        body.sha256(b"b")


def _changing_reads(
    monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]
) -> Callable[[int, list[memoryview]], int]:
    """`os.readv` as `body_file` calls it, `change` run once after its first read: a file
    changed by another process while it is hashed, at a point no timing decides."""
    real = os.readv
    reads: list[int] = []

    def readv(fd: int, buffers: list[memoryview]) -> int:
        got = real(fd, buffers)
        reads.append(got)
        if len(reads) == 1:
            change()
        return got

    monkeypatch.setattr(os, "readv", readv)
    return readv


def test_a_file_that_shrinks_while_it_is_hashed_gives_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the first MiB read alone was "the body", a wrong digest with no word of it.
    path = tmp_path / "body"
    path.write_bytes(b"a" * (3 << 20))
    _changing_reads(monkeypatch, lambda: os.truncate(path, 1 << 20))
    with pytest.raises(OSError, match="changed while it was read"):
        read_body_file(path)


def test_a_file_that_grows_while_it_is_hashed_gives_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "body"
    path.write_bytes(b"a" * (2 << 20))

    def append() -> None:
        with path.open("ab") as file:
            file.write(b"data: more\n\n")

    _changing_reads(monkeypatch, append)
    with pytest.raises(OSError, match="changed while it was read"):
        read_body_file(path)


def test_a_file_rewritten_in_place_while_it_is_hashed_gives_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "body"
    path.write_bytes(b"a" * (2 << 20))
    before = path.stat()

    def rewrite() -> None:
        with path.open("r+b") as file:
            file.write(b"b" * (2 << 20))  # the same size
        # a clock tick apart from the open, whatever the filesystem's time granularity
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))

    _changing_reads(monkeypatch, rewrite)
    with pytest.raises(OSError, match="changed while it was read"):
        read_body_file(path)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="no /proc")
def test_a_file_that_says_a_size_it_does_not_have_gives_no_verdict() -> None:
    # /proc's files say 0 bytes and hold more: before, one opened as an empty body.
    assert Path("/proc/self/status").stat().st_size == 0
    with pytest.raises(OSError, match="changed while it was read"):
        read_body_file("/proc/self/status")


def test_a_file_left_alone_while_it_is_hashed_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "body"
    path.write_bytes(b"a" * (2 << 20) + RECEIPT)
    _changing_reads(monkeypatch, lambda: None)
    body = read_body_file(path)
    assert body.size == (2 << 20) + len(RECEIPT)
    assert body.sha256(body.tail) == hashlib.sha256(path.read_bytes()).digest()
