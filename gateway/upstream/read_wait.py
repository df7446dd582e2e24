"""How an upstream response waits for its next read (`ReadWait`, the base of
`UpstreamResponse`, gateway/upstream/response.py): each read has a deadline, and one
timer per response, not one per read, enforces them.
"""

from __future__ import annotations

import asyncio

from gateway.upstream.failures import UpstreamError

__all__ = ["ReadWait"]

_TIMER_SLACK_S = 0.001  # how early a loop may run a timer (uvloop: millisecond ticks)


class ReadWait:
    """The waiting half of a response: `_wait` for the next read, the end or a failure,
    within a deadline; the response sets `_due` as each read arrives."""

    _read_timeout: float
    _waiter: asyncio.Future[None] | None
    _timer: asyncio.TimerHandle | None
    _due: float  # event-loop time the current read gives up
    _due_what: str

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        raise NotImplementedError

    def _next_wait(
        self, loop: asyncio.AbstractEventLoop, deadline: float | None
    ) -> tuple[float, str]:
        """How long the next read may take, and what its timeout says."""
        wait, what = self._read_timeout, "backend stopped sending mid-response"
        if deadline is not None and deadline - loop.time() < wait:
            wait, what = deadline - loop.time(), "the answer did not end in time"
        return wait, what

    async def _wait(self, timeout: float, what: str) -> None:
        """Wait for bytes, the end or an error, at most `timeout` seconds (then `timeout`).
        A stream's reads come one after another, each with its own deadline; arming and
        cancelling a timer for each would cost more than the read, so the response keeps
        one timer, armed at the earliest deadline still pending and moved on when it fires
        early (`_check_due`)."""
        loop = self.loop
        waiter = self._waiter = loop.create_future()
        due = self._due = loop.time() + timeout
        self._due_what = what
        timer = self._timer
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(due, self._check_due)
        try:
            await waiter
        finally:
            self._waiter = None
            # The waiter holds the exception it raised here (a timeout, a broken
            # connection), whose traceback holds this frame: not kept among its locals,
            # or the frames the exception passed (the request's, its body among their
            # locals) would stay in a reference cycle until the cyclic collector ran.
            del waiter

    def _check_due(self) -> None:
        """The timer: fail a read that is past its deadline, or move on to it."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits now: the next read arms the timer again
        loop = waiter.get_loop()
        # Timers may fire up to the loop's clock resolution early (1 ms on uvloop).
        if loop.time() + _TIMER_SLACK_S >= self._due:
            waiter.set_exception(UpstreamError("timeout", self._due_what))
        else:
            self._timer = loop.call_at(self._due, self._check_due)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
