"""The line the log's tile reads wait in for a thread: bounded, first come first served
per admin token, fair across tokens (`ReadLine`).

A tlog client (golang.org/x/mod/sumdb/tlog's tile readers, a C2SP tlog-tiles mirror,
`owngate audit verify URL`) fetches the tiles a proof needs in parallel, often more than
the four reads in flight one admin token may hold (gateway/admin/work.py
`LOG_READS_PER_CALLER`). Refusing the fifth with 429 at once made every such client back
off for a second per tile burst. Now a read that finds the bound reached waits here for
its turn instead:

- in a line of at most `most_waiting` reads in all and `per_owner_waiting` of one token's;
  a read past either is refused at once (429 `rate_limit_exceeded`, `retry-after: 1`),
  as is one that waited `wait_s` without its turn (then the line forgets it);
- first come first served among one token's reads;
- across tokens, a freed thread goes to the waiting read of the token holding the fewest
  reads in flight (the longest waiting of those on a tie), never to a token already at its
  own bound: a token sending as many reads as it can takes no turn from another, which
  waits behind at most the reads already running.

A read that arrives while nobody waits and a thread is free (within its token's bound)
runs at once. Everything here runs on the event loop: a read's end (`give_back`, called
there by the thread's callback) hands its thread to the next in line in the same turn.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from typing import Final

from gateway.errors import ErrorCode, GatewayError
from gateway.in_flight import Holdings

__all__ = ["ReadLine"]

_RETRY_SOON: Final = ((b"retry-after", b"1"),)


class _Waiter:
    __slots__ = ("order", "turn")

    def __init__(self, order: int, turn: asyncio.Future[None]) -> None:
        self.order = order  # arrival, for first come first served across tokens on a tie
        self.turn = turn  # done (result None) once the read holds a thread


class ReadLine:
    """At most `most` reads in flight, `per_owner` of one owner's; past either, a read
    waits its turn (see the module docstring). `refusal(reason)` words a 429, `reason`
    one of "line", "owner_line" and "waited"."""

    def __init__(
        self,
        most: int,
        per_owner: int,
        *,
        most_waiting: int,
        per_owner_waiting: int,
        wait_s: float,
        refusal: Callable[[str], str],
    ) -> None:
        self._most, self._per_owner = most, per_owner
        self._most_waiting, self._per_owner_waiting = most_waiting, per_owner_waiting
        self._wait_s = wait_s
        self._refusal = refusal
        self._held = Holdings()  # the reads in flight, by owner and in all
        self._lines: dict[str, deque[_Waiter]] = {}  # owner -> its waiting reads, oldest first
        self._waiting = 0
        self._arrivals = itertools.count()

    def held(self, owner: str) -> int:
        return self._held.of(owner)

    def waiting(self, owner: str | None = None) -> int:
        """Reads waiting for a thread: `owner`'s, or everyone's."""
        if owner is None:
            return self._waiting
        return len(self._lines.get(owner, ()))

    async def take(self, owner: str) -> None:
        """A thread for one read of `owner`, at once or after waiting its turn; raises
        `GatewayError` (429, retry after 1 s) holding none when the line is full or the
        turn did not come within `wait_s`."""
        if owner not in self._lines and self._free_for(owner):
            self._held.hold(owner)
            return
        if self._waiting >= self._most_waiting:
            raise self._refused("line")
        line = self._lines.setdefault(owner, deque())
        if len(line) >= self._per_owner_waiting:
            raise self._refused("owner_line")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(next(self._arrivals), loop.create_future())
        line.append(waiter)
        self._waiting += 1
        timer = loop.call_later(self._wait_s, self._expire, owner, waiter)
        try:
            await waiter.turn
        except BaseException:
            turn = waiter.turn
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self.give_back(owner)  # given a thread as its waiter left: pass it on
            else:
                self._leave(owner, waiter)
            raise
        finally:
            timer.cancel()

    def give_back(self, owner: str) -> None:
        """One read of `owner` is done: its thread goes to the next in line, if any."""
        self._held.give_back(owner)
        self._next_turns()

    def _free_for(self, owner: str) -> bool:
        return self._held.total < self._most and self._held.of(owner) < self._per_owner

    def _next_turns(self) -> None:
        """Give free threads to waiting reads: of the tokens below their own bound, the
        one holding fewest reads first, the longest waiting on a tie."""
        while self._held.total < self._most:
            chosen: tuple[int, int, str] | None = None
            for owner, line in self._lines.items():  # tokens with a read waiting: a few
                held = self._held.of(owner)
                if held < self._per_owner:
                    rank = (held, line[0].order, owner)
                    if chosen is None or rank < chosen:
                        chosen = rank
            if chosen is None:
                return
            owner = chosen[2]
            waiter = self._lines[owner][0]
            self._leave(owner, waiter)
            self._held.hold(owner)
            waiter.turn.set_result(None)

    def _expire(self, owner: str, waiter: _Waiter) -> None:
        if not waiter.turn.done():
            self._leave(owner, waiter)
            waiter.turn.set_exception(self._refused("waited"))

    def _leave(self, owner: str, waiter: _Waiter) -> None:
        line = self._lines.get(owner)
        if line is None or waiter not in line:
            return
        line.remove(waiter)  # the line is short (`per_owner_waiting`)
        self._waiting -= 1
        if not line:
            del self._lines[owner]

    def _refused(self, reason: str) -> GatewayError:
        return GatewayError(
            ErrorCode.rate_limit_exceeded, self._refusal(reason), headers=_RETRY_SOON
        )
