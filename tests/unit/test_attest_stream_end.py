"""What the sidecar writes after a stream's bytes before its countersignature comment
(gateway/attest/stream_end.py): a line end after an unended last line, and an `id` line
with no value after a stream whose events had `id` fields, however the stream was cut
into reads (the answer must not depend on where the backend's writes fell)."""

from __future__ import annotations

import random
import re

import pytest

from gateway.attest.stream_end import StreamEnd

EVENT = b'data: {"choices":[]}\n\n'
# (stream, what goes after it)
CASES: dict[str, tuple[bytes, bytes]] = {
    "no-ids": (EVENT + EVENT, b""),
    "no-ids-unended": (EVENT + b"data: x", b"\n"),
    "id-lf": (b"id: 1\n" + EVENT, b"id\n"),
    "id-crlf": (b"id: 1\r\n" + EVENT.replace(b"\n", b"\r\n"), b"id\n"),
    "id-cr": (b"id: 1\r" + EVENT.replace(b"\n", b"\r"), b"id\n"),
    "id-later-event": (EVENT + b"id:7\n" + EVENT, b"id\n"),
    "id-no-colon": (EVENT + b"id\n" + EVENT, b"id\n"),
    "id-bom-first": (b"\xef\xbb\xbfid: 1\n" + EVENT, b"id\n"),
    "id-last-line-unended": (EVENT + b"id: 1", b"\nid\n"),
    "id-bare-last-line-unended": (EVENT + b"id", b"\nid\n"),
    "id-after-cr-of-crlf": (EVENT.replace(b"\n", b"\r\n") + b"id: 1\r\n\r\n", b"id\n"),
    # not an id field: another field, `id` inside a line or a value
    "idx-field": (b"idx: 1\n" + EVENT, b""),
    "id-in-data": (b"data: id: 1\n\n", b""),
    "id-in-comment": (b": id\n\n", b""),
    "id-mid-line": (b"data: x\rxid: 1\n\n", b""),
}


@pytest.mark.parametrize("name", list(CASES))
def test_what_follows_a_stream_does_not_depend_on_its_reads(name: str) -> None:
    stream, after = CASES[name]
    whole = StreamEnd()
    whole.feed(stream)
    assert whole.after() == after
    for cut in range(1, len(stream)):  # every split in two
        two = StreamEnd()
        two.feed(stream[:cut])
        two.feed(stream[cut:])
        assert two.after() == after, cut
    byte_by_byte = StreamEnd()
    for i in range(len(stream)):
        byte_by_byte.feed(stream[i : i + 1])
    assert byte_by_byte.after() == after


def test_nothing_relayed_needs_nothing_after_it() -> None:
    end = StreamEnd()
    end.feed(b"")
    assert end.after() == b""


def _read_as_lines(stream: bytes) -> bytes:
    """What follows `stream`, from its lines as the SDK splits them (LF, CRLF, bare CR)."""
    lines = re.split(rb"\r\n|\r|\n", stream)
    ids = any(
        line.removeprefix(b"\xef\xbb\xbf") == b"id"
        or line.removeprefix(b"\xef\xbb\xbf").startswith(b"id:")
        for line in lines
    )
    unended = stream[-1:] not in (b"", b"\n", b"\r")
    return (b"\n" if unended else b"") + (b"id\n" if ids else b"")


PIECES: tuple[bytes, ...] = (b"id", b"id:", b"idx:", b"i", b"d", b":", b"\r", b"\n", b"\r\n")
PIECES += (b"\xef\xbb\xbf", b"data: ", b'{"id":1}', b"x" * 9, b"data: [DONE]\n\n")


def test_random_streams_cut_at_random_get_what_their_lines_call_for() -> None:
    """Against the rule read line by line: any piece order, any cuts (seeded)."""
    rng = random.Random(20261207)
    for _ in range(20_000):
        stream = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 10)))
        cuts = sorted(rng.sample(range(len(stream) + 1), min(len(stream) + 1, rng.randint(0, 5))))
        end, start = StreamEnd(), 0
        for cut in [*cuts, len(stream)]:
            end.feed(stream[start:cut])
            start = cut
        assert end.after() == _read_as_lines(stream), (stream, cuts)
