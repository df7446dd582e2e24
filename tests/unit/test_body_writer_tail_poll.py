"""`BodyWriter.taken` looks at an answer's unread tail (below the pause mark no event says
when the kernel took it) less often the longer it stays: at 10 ms for good, each client
that leaves such a tail unread woke its request 100 times a second until the write
timeout (120 s), and a few thousand such connections held the event loop's CPU."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.body_writer import BodyWriter


class _Transport:
    def __init__(self, looks: int) -> None:
        self.looks = looks  # how many looks find the tail still there

    def get_write_buffer_size(self) -> int:
        self.looks -= 1
        return 1000 if self.looks >= 0 else 0

    def is_closing(self) -> bool:  # open: an empty buffer is one the kernel took
        return False


class _Flow:
    write_paused = False


class _Cycle:
    def __init__(self, looks: int) -> None:
        self.transport = _Transport(looks)
        self.flow = _Flow()
        self.disconnected = False


def test_an_unread_tail_is_looked_at_less_often_the_longer_it_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def sleep(delay: float) -> None:  # the waits asked for, none taken
        waits.append(delay)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    cycle: Any = _Cycle(looks=300)
    assert asyncio.run(BodyWriter(cycle).taken()) is True
    assert len(waits) == 300
    assert waits[0] <= 0.01  # a tail taken soon is seen soon
    assert max(waits) <= 1.0  # and one taken late within a second of it
    # 300 looks cover minutes of a tail left unread, not 3 s (10 ms each, before).
    assert sum(waits) > 60, sum(waits)


def test_a_lost_connection_ends_the_wait_as_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    cycle: Any = _Cycle(looks=10**9)

    async def sleep(delay: float) -> None:
        cycle.disconnected = True

    monkeypatch.setattr(asyncio, "sleep", sleep)
    assert asyncio.run(BodyWriter(cycle).taken()) is False
