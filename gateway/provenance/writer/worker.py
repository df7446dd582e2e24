"""`LoopWorker`: one thread that runs an event loop's blocking calls, one hand-off each way.

The provenance log hands its writes, snapshots and exports to threads of their own so that
the event loop never blocks on disk. `loop.run_in_executor` on a `ThreadPoolExecutor` costs
more than the hand-off itself: per call a `concurrent.futures.Future` with its own
`Condition`, a work item, the executor's coroutine-function checks and an asyncio future
chained to the concurrent one by callbacks in both directions. The log's writer hands off
once per batch, which at low concurrency is once per request. Here a call is a tuple put on
a `SimpleQueue` (C) and one `call_soon_threadsafe` that resolves the caller's future.

Calls run one at a time, in the order they were made. A caller that is cancelled while its
call runs does not stop the call (as with `run_in_executor` once a call started): its
result is dropped. `then`, if given, runs on the loop with the result of a call that
returned, in the very callback that brings the result back and before the caller wakes
(even a cancelled caller's: the call's effect happened): the log wakes a batch's
appenders there, one loop turn before its committer would. The thread is a daemon, so a
process that exits without `shutdown` never hangs on it; a write it was doing then is what
a crash would leave, which the log recovers from (and which nobody was told was durable).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["LoopWorker"]

_T = TypeVar("_T")
_Then = Callable[[Any], None] | None
_Job = tuple["asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...], _Then]


class LoopWorker:
    """A named thread serving `loop`; create it on the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def run(
        self,
        function: Callable[..., _T],
        *args: object,
        then: Callable[[_T], None] | None = None,
    ) -> _T:
        """`function(*args)` on the thread; its result, or what it raised. `then(result)`
        runs on the loop before the caller wakes; what it raises, the caller gets."""
        if self._stopped:
            raise RuntimeError(f"{self._thread.name} has been shut down")
        done: asyncio.Future[_T] = self._loop.create_future()
        self._jobs.put((done, function, args, then))
        return await done

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then end the thread (waiting for it with `wait`)."""
        if not self._stopped:
            self._stopped = True
            self._jobs.put(None)
        if wait and self._thread is not threading.current_thread():
            self._thread.join()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            done, function, args, then = job
            try:
                result = function(*args)
            except StopIteration as exc:  # a future refuses it: the caller would never wake
                error = RuntimeError(f"{function!r} raised StopIteration")
                error.__cause__ = exc
                self._deliver(_fail, done, error)
            except BaseException as exc:  # noqa: BLE001 - delivered to the caller, who raises it
                self._deliver(_fail, done, exc)
            else:
                self._deliver(_succeed, done, result, then)

    def _deliver(
        self, how: Callable[..., None], done: asyncio.Future[Any], value: Any, then: _Then = None
    ) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            self._loop.call_soon_threadsafe(how, done, value, then)


def _succeed(done: asyncio.Future[Any], result: Any, then: _Then) -> None:
    if then is not None:
        try:
            then(result)
        except Exception as exc:  # noqa: BLE001 - delivered to the caller, who raises it
            _fail(done, exc)
            return
    if not done.done():
        done.set_result(result)


def _fail(done: asyncio.Future[Any], error: BaseException, then: _Then = None) -> None:
    if not done.done():
        done.set_exception(error)
