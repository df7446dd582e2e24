"""The Python functions a piece of code calls, for tests that hold a hot path to a count
of Python frames (a frame is ~1,000 instructions: per request or per chunk, they add up)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType, FrameType

__all__ = ["by_name", "by_place", "by_qualname", "python_calls"]


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
