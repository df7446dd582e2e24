"""`audit.body_file`: a body file hashed as it is read, its tail kept to find what the
gateway wrote after a stream's bytes. For every tail the gateway writes, the bodies a
commitment may be to are those of the file read whole, whatever the tail kept."""

from __future__ import annotations

import hashlib
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
