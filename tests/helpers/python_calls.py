"""The Python functions a piece of code calls, for tests that hold a hot path to a count
of Python frames (a frame is ~1,000 instructions: per request or per chunk, they add up).

`python_steps(run)` is the number of Python lines run, Python functions called and C
functions called while `run()` runs on this thread: a count, not a time, so two bodies of
different sizes cost the same number of steps when nothing is done per element. The
collector is off while it counts (after a collection first), so no finalizer of another
test's objects (a socket, a generator) runs in between and adds steps of its own."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

__all__ = ["by_name", "by_place", "by_qualname", "python_calls", "python_steps"]


def by_place(code: CodeType) -> str:
    """`file:function`, telling apart functions of one name in different modules."""
    return f"{code.co_filename}:{code.co_name}"


def by_name(code: CodeType) -> str:
    return code.co_name


def by_qualname(code: CodeType) -> str:
    return code.co_qualname


def python_calls(
    run: Callable[[], object], name: Callable[[CodeType], str] = by_place
) -> list[str]:
    """Each Python function `run()` called (C functions are not counted; `run`'s own frame,
    a test's lambda or function, is not either), in order, as `name` writes it, on this
    thread only."""
    calls: list[str] = []
    own = getattr(run, "__code__", None)

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is not own:
            calls.append(name(frame.f_code))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def python_steps(run: Callable[[], object], expected: tuple[type[BaseException], ...] = ()) -> int:
    """The steps `run()` takes (an exception of `expected` ends it as a return would)."""
    steps = 0

    def trace(_frame: Any, _event: str, _arg: Any) -> Any:
        nonlocal steps
        steps += 1  # a call, then each line and return of the frame it traces
        return trace

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal steps
        steps += event == "c_call"

    tracer, profiler = sys.gettrace(), sys.getprofile()
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    sys.settrace(trace)
    sys.setprofile(profile)
    try:
        run()
    except expected:
        pass
    finally:
        sys.setprofile(profiler)
        sys.settrace(tracer)
        if collecting:
            gc.enable()
    return steps
