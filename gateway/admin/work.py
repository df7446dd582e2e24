"""The admin API's heavy work in worker threads of its own, bounded (`AdminWork`).

Verifying a receipt, reading cosignatures, an audit report, a request's records, policy
test cases and a candidate config each read the log or parse client YAML in a worker
thread. They ran on the event loop's default executor (`asyncio.to_thread`), a few
threads (`min(32, CPUs + 4)`: 6 on two CPUs) that the gateway's own work needs too: a
config or policy reload reads and compiles there, a key change writes the keys file
there, LiteLLM is loaded there and serves its synchronous providers there, and on
asyncio's loop (not uvloop's) every backend's `getaddrinfo` runs there. So an admin token
with the auditor role, sending verifies or cosignature reads the disk was slow to answer,
held every thread: an operator's key revocation or reload waited behind them.

Now that work runs in `AdminWork`'s own `THREADS` threads, none of the default executor's,
and no more of it is admitted than there are threads: past `THREADS` calls in flight, or
`PER_CALLER` of one admin token's, the request is refused at once with 429
`rate_limit_exceeded` and `retry-after: 1`, as a tenant's proof reads are
(gateway/api/tenant_reads.py `ProofReads`), never queued. A call counts until its thread
is done with it, not until its request ends: a client that leaves while its call runs
does not free the thread for another. Key changes (gateway/admin/key_changes.py) stay on
the default executor: quick file work that an auditor's load must never refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, TypeVar

from fastapi import Request

from gateway.admin.auth import Caller
from gateway.in_flight import InFlight

__all__ = ["PER_CALLER", "THREADS", "AdminWork", "in_thread"]

THREADS: Final = 4  # the admin's worker threads, and its calls in flight at most
PER_CALLER: Final = 2  # of them, one admin token's
_T = TypeVar("_T")


class AdminWork:
    """The admin's worker threads (made on first use) and the calls in flight on them,
    in all and per caller (`run`: one more, or 429)."""

    def __init__(self, threads: int = THREADS, per_caller: int = PER_CALLER) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight = InFlight(
            threads,
            per_caller,
            lambda mine: (
                f"this admin token already runs {mine} log reads or checks at once, "
                "as many as one token may; retry when one is answered"
            ),
            lambda total: (
                f"the admin API already runs {total} log reads or checks at once, "
                "as many as it runs; retry shortly"
            ),
        )

    def running(self, caller: str) -> int:
        return self._in_flight.held(caller)

    async def run(self, caller: str, call: Callable[..., _T], *args: object) -> _T:
        """`call(*args)` in one of the admin's threads, for `caller` (an admin token's
        digest prefix); raises `GatewayError` (429, retry after 1 s) when the caller or
        the admin already runs as many calls as it may."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="owngate-admin")
        self._in_flight.take(caller)  # raises, holding nothing
        try:
            done: Future[_T] = self._pool.submit(context.run, call, *args)
        except BaseException:  # not submitted (the pool shut down): nothing runs
            self._in_flight.give_back(caller)
            raise

        def finished(_: Future[_T]) -> None:  # in the thread, or here if never started
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing left to bound
                loop.call_soon_threadsafe(self._in_flight.give_back, caller)

        done.add_done_callback(finished)
        return await asyncio.wrap_future(done)

    def shutdown(self) -> None:
        """Start no more calls (those not started are dropped); running ones finish."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


async def in_thread(request: Request, caller: Caller, call: Callable[..., _T], *args: object) -> _T:
    """`call(*args)` in the admin app's worker threads (`AdminWork.run`), for `caller`."""
    work: AdminWork = request.app.state.work
    return await work.run(caller.token, call, *args)
