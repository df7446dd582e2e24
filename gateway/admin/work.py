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

The log's files served as tlog-tiles (`/log/checkpoint`, `/log/tile/...`,
gateway/admin/tiles.py) are read in an `AdminWork` of their own (`LOG_READS` threads,
`LOG_READS_PER_CALLER` of them one token's), refused past either bound the same way. They
were sync routes, run in anyio's default 40 threads: one auditor token held them all
(40 entry bundles of up to 16 MiB each read at once) while other auditors and the
gateway's own anyio-thread users waited. A pool of their own keeps a tile cheap (an
auditor's client fetches thousands, several at once) and never behind a verify or a report.
A read past either bound waits its turn in a short line (gateway/admin/read_line.py:
`LOG_WAITING` in all, `LOG_WAITING_PER_CALLER` of one token's, at most `LOG_WAIT_S`),
fair across tokens, and is refused with 429 only past it: a tlog client fetches several
tiles at once. An entry bundle's later chunks, streamed as its client takes them
(gateway/admin/log_stream.py), are read in the same threads (`more`) without taking a
turn: the read that opened the file took it.
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
from gateway.admin.read_line import ReadLine
from gateway.in_flight import InFlight

__all__ = [
    "LOG_READS",
    "LOG_READS_PER_CALLER",
    "LOG_WAITING",
    "LOG_WAITING_PER_CALLER",
    "LOG_WAIT_S",
    "PER_CALLER",
    "THREADS",
    "AdminWork",
    "in_thread",
    "log_read_line",
]

THREADS: Final = 4  # the admin's worker threads, and its calls in flight at most
PER_CALLER: Final = 2  # of them, one admin token's
# The log's tile and checkpoint reads: at most 8 files (8 x 16 MiB bundles) read at once.
LOG_READS: Final = 8
LOG_READS_PER_CALLER: Final = 4  # of them, one admin token's
# Past those, a read waits its turn (read_line.py): this many in all, of one token's, this long.
LOG_WAITING: Final = 32  # as many as the admin listener's connections
LOG_WAITING_PER_CALLER: Final = 16
LOG_WAIT_S: Final = 10.0
_T = TypeVar("_T")


class AdminWork:
    """The admin's worker threads (made on first use) and the calls in flight on them,
    in all and per caller (`run`: one more, or 429 whose message names the calls as
    `what`)."""

    def __init__(
        self,
        threads: int = THREADS,
        per_caller: int = PER_CALLER,
        what: str = "log reads or checks",
        line: ReadLine | None = None,
    ) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._line = line  # where a call past the bounds waits its turn; None: refused
        self._in_flight = InFlight(
            threads,
            per_caller,
            lambda mine: (
                f"this admin token already runs {mine} {what} at once, "
                "as many as one token may; retry when one is answered"
            ),
            lambda total: (
                f"the admin API already runs {total} {what} at once, "
                "as many as it runs; retry shortly"
            ),
        )

    def running(self, caller: str) -> int:
        if self._line is not None:
            return self._line.held(caller)
        return self._in_flight.held(caller)

    def waiting(self, caller: str | None = None) -> int:
        """Calls waiting their turn in the line: `caller`'s, or everyone's (0: no line)."""
        return 0 if self._line is None else self._line.waiting(caller)

    async def run(self, caller: str, call: Callable[..., _T], *args: object) -> _T:
        """`call(*args)` in one of the admin's threads, for `caller` (an admin token's
        digest prefix); raises `GatewayError` (429, retry after 1 s) when the caller or
        the admin already runs as many calls as it may (and, with a line, when the line
        is full or the call's turn did not come in time)."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        if self._line is not None:
            await self._line.take(caller)  # raises, holding nothing
            give_back = self._line.give_back
        else:
            self._in_flight.take(caller)  # raises, holding nothing
            give_back = self._in_flight.give_back
        try:
            done: Future[_T] = self._threads_pool().submit(context.run, call, *args)
        except BaseException:  # not submitted (the pool shut down): nothing runs
            give_back(caller)
            raise

        def finished(_: Future[_T]) -> None:  # in the thread, or here if never started
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing left to bound
                loop.call_soon_threadsafe(give_back, caller)

        done.add_done_callback(finished)
        return await asyncio.wrap_future(done)

    async def more(self, call: Callable[..., _T], *args: object) -> _T:
        """`call(*args)` in the same threads, as a further step of a call `run` admitted
        (a streamed file's next chunk): never refused, it queues behind what runs."""
        context = contextvars.copy_context()
        return await asyncio.wrap_future(self._threads_pool().submit(context.run, call, *args))

    def _threads_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="owngate-admin")
        return self._pool

    def shutdown(self) -> None:
        """Start no more calls (those not started are dropped); running ones finish."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def log_read_line() -> ReadLine:
    """The line the log's reads wait in past their bounds (`LOG_*`, read_line.py)."""
    return ReadLine(
        LOG_READS,
        LOG_READS_PER_CALLER,
        most_waiting=LOG_WAITING,
        per_owner_waiting=LOG_WAITING_PER_CALLER,
        wait_s=LOG_WAIT_S,
        refusal=_log_refusal,
    )


def _log_refusal(reason: str) -> str:
    if reason == "owner_line":
        return (
            f"this admin token already has {LOG_WAITING_PER_CALLER} tile or checkpoint "
            "reads waiting for a thread, as many as one token may; retry when one is answered"
        )
    if reason == "line":
        return (
            f"the admin API already has {LOG_WAITING} tile or checkpoint reads waiting, "
            "as many as it keeps; retry shortly"
        )
    return f"no thread came free for this read within {LOG_WAIT_S:g} s; retry shortly"


async def in_thread(request: Request, caller: Caller, call: Callable[..., _T], *args: object) -> _T:
    """`call(*args)` in the admin app's worker threads (`AdminWork.run`), for `caller`."""
    work: AdminWork = request.app.state.work
    return await work.run(caller.token, call, *args)
