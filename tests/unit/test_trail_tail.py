"""`Trail.tail`: the last bytes of a relayed stream (where its usage chunk is), kept
without copying the tail for every piece."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.api.trail import _TAIL, Trail
from gateway.provenance import Salts


@given(st.lists(st.binary(max_size=3 * _TAIL), max_size=40))
def test_the_tail_is_the_last_bytes_relayed(pieces: list[bytes]) -> None:
    trail = Trail(Salts.generate(), "")
    relayed = b""
    for piece in pieces:
        trail.relayed(piece)
        relayed += piece
        assert trail.tail == relayed[-_TAIL:]
    assert trail.sent_bytes == len(relayed)


def test_what_is_held_stays_bounded_over_a_long_stream() -> None:
    trail = Trail(Salts.generate(), "")
    for _ in range(10_000):
        trail.relayed(b"data: {}\n\n")
        assert trail._held <= 2 * _TAIL + 10
