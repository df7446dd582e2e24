"""`LoopWorker`: the provenance log's hand-off to its writer and checkpoint threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.provenance.writer.worker import LoopWorker


def test_runs_on_its_own_thread_and_returns_the_result() -> None:
    asyncio.run(_runs_on_its_own_thread_and_returns_the_result())


async def _runs_on_its_own_thread_and_returns_the_result() -> None:
    worker = LoopWorker(asyncio.get_running_loop(), "test-worker")
    try:
        name = await worker.run(lambda: threading.current_thread().name)
        assert name == "test-worker"
        assert await worker.run(pow, 2, 10) == 1024
    finally:
        worker.shutdown()


def test_what_the_call_raises_is_raised_to_the_caller() -> None:
    asyncio.run(_what_the_call_raises_is_raised_to_the_caller())


async def _what_the_call_raises_is_raised_to_the_caller() -> None:
    worker = LoopWorker(asyncio.get_running_loop(), "test-worker")
    try:
        with pytest.raises(ZeroDivisionError):
            await worker.run(lambda: 1 // 0)
        assert await worker.run(str, 5) == "5"  # the thread outlived the error
    finally:
        worker.shutdown()


def test_calls_run_one_at_a_time_in_order() -> None:
    asyncio.run(_calls_run_one_at_a_time_in_order())


async def _calls_run_one_at_a_time_in_order() -> None:
    worker = LoopWorker(asyncio.get_running_loop(), "test-worker")
    seen: list[int] = []
    try:
        await asyncio.gather(*(worker.run(seen.append, i) for i in range(200)))
    finally:
        worker.shutdown()
    assert seen == list(range(200))


def test_a_cancelled_caller_does_not_stop_the_running_call() -> None:
    asyncio.run(_a_cancelled_caller_does_not_stop_the_running_call())


async def _a_cancelled_caller_does_not_stop_the_running_call() -> None:
    worker = LoopWorker(asyncio.get_running_loop(), "test-worker")
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def blocking() -> str:
        started.set()
        release.wait(10)
        finished.append("done")
        return "done"

    try:
        call = asyncio.ensure_future(worker.run(blocking))
        await asyncio.to_thread(started.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        release.set()
        assert await worker.run(len, finished) == 1  # the next call runs after it
    finally:
        release.set()
        worker.shutdown()


def test_shutdown_runs_what_is_queued_then_refuses_more() -> None:
    asyncio.run(_shutdown_runs_what_is_queued_then_refuses_more())


async def _shutdown_runs_what_is_queued_then_refuses_more() -> None:
    worker = LoopWorker(asyncio.get_running_loop(), "test-worker")
    gate = threading.Event()
    seen: list[int] = []
    first = asyncio.ensure_future(worker.run(gate.wait, 10))
    second = asyncio.ensure_future(worker.run(seen.append, 1))
    await asyncio.sleep(0)  # both are queued
    gate.set()
    await asyncio.to_thread(worker.shutdown)
    assert await first is True
    await second
    assert seen == [1]
    with pytest.raises(RuntimeError, match="shut down"):
        await worker.run(seen.append, 2)


def test_a_result_for_a_closed_loop_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    worker = LoopWorker(loop, "test-worker")
    loop.close()
    first, second = threading.Event(), threading.Event()
    # queued as `run` queues a call, for a loop that closed meanwhile
    worker._jobs.put((loop.create_future(), first.set, (), None))
    worker._jobs.put((loop.create_future(), second.set, (), None))
    worker.shutdown()
    # the first delivery met a closed loop; the thread went on to the second call
    assert first.is_set() and second.is_set()


def test_a_call_raising_stop_iteration_does_not_leave_its_caller_waiting() -> None:
    """A future refuses StopIteration (TypeError in the loop's callback): the caller gets
    an error all the same instead of waiting forever."""
    asyncio.run(_a_call_raising_stop_iteration_does_not_leave_its_caller_waiting())


async def _a_call_raising_stop_iteration_does_not_leave_its_caller_waiting() -> None:
    worker = LoopWorker(asyncio.get_running_loop(), "test-worker")
    try:
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(worker.run(next, iter(())), 5.0)
    finally:
        worker.shutdown()
