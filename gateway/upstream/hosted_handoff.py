"""The coroutine LiteLLM's worker thread hands back to a hosted call, closed if the call is gone.

LiteLLM 1.108.7's `acompletion`, `atext_completion` and `aembedding`, and the `aresponses`
its Responses bridge calls (gateway/upstream/responses_bridge.py), run their sync twins
(`completion`, `text_completion`, `embedding`, `responses`) in the event loop's default
executor; for an async call a twin builds the request and returns the coroutine that sends
it (`OpenAIChatCompletion.async_streaming`, ...), which the async function then awaits. A call
that ended while that thread ran (its client gone, its deadline past, the gateway shutting
down) is cancelled at that await, and asyncio drops what the thread then returns into the
cancelled future: the coroutine was never awaited nor closed, and a later garbage
collection, in whatever code ran then, warned "coroutine
'OpenAIChatCompletion.async_streaming' was never awaited", one per request cancelled there
(with warnings as errors, as the test suite has them, whichever test came next failed).

`install_handoff_guard()` (run once, when LiteLLM is loaded: gateway/upstream/
litellm_runtime.py) wraps the twins where the async functions look them up (the globals of
`litellm.main` and `litellm.responses.main`): run in a worker thread within
`guarding_handoffs()` (around gateway/upstream/hosted.py's call), a coroutine a twin returns
is handed to the block, or closed at once if the block has ended; as the block ends, every
coroutine handed to it that nothing started is closed. One never started holds no
connection, nothing of it was sent; one LiteLLM started was awaited within the block, where
a cancellation reached it (and closed its connection). A LiteLLM without the twins raises
`HandoffNotFound` at load: hosted calls then fail, they do not leak unchecked.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

__all__ = ["TWINS", "HandoffNotFound", "guarding_handoffs", "install_handoff_guard"]

# Where LiteLLM 1.108.7's async functions find the sync twins they run in the executor.
TWINS: Final = (
    ("litellm.main", ("completion", "text_completion", "embedding")),
    ("litellm.responses.main", ("responses",)),
)
_MARK: Final = "_owngate_guards_handoff"


class HandoffNotFound(RuntimeError):
    """The installed LiteLLM has no sync twin where this module expects one."""


class _Handoffs:
    """The coroutines handed to one `guarding_handoffs` block: taken in worker threads,
    settled on the event loop as the block ends."""

    __slots__ = ("_ended", "_handed", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = False
        self._handed: list[Any] = []

    def take(self, coroutine: Any) -> None:
        """Keep `coroutine` for the block to settle, or close it if the block has ended:
        no one awaits it then."""
        with self._lock:
            if not self._ended:
                self._handed.append(coroutine)
                return
        coroutine.close()

    def end(self) -> None:
        """Close every coroutine handed over that nothing started (its future was
        cancelled); take no more."""
        with self._lock:
            self._ended = True
            handed, self._handed = self._handed, []
        for coroutine in handed:
            if inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
                coroutine.close()


_BLOCK: ContextVar[_Handoffs | None] = ContextVar("owngate_hosted_handoffs", default=None)


@contextmanager
def guarding_handoffs() -> Iterator[None]:
    """Within this block (and the contexts LiteLLM copies from it for its worker threads),
    a coroutine a wrapped twin returns in a worker thread is closed unless it was started
    by the time the block ends."""
    handoffs = _Handoffs()
    token = _BLOCK.set(handoffs)
    try:
        yield
    finally:
        _BLOCK.reset(token)
        handoffs.end()


def install_handoff_guard(twins: tuple[tuple[str, tuple[str, ...]], ...] = TWINS) -> None:
    """Wrap the twins (`twins`: each a module and function names) in their module;
    idempotent. Raises `HandoffNotFound`, wrapping none, when LiteLLM lacks one."""
    found = []
    for module_name, names in twins:
        try:
            module = importlib.import_module(module_name)
            found += [(module, name, getattr(module, name)) for name in names]
        except (ImportError, AttributeError) as exc:
            raise HandoffNotFound(
                f"LiteLLM's sync functions ({module_name}: {', '.join(names)}) are not where "
                "owngate expects them: a hosted call cancelled while one ran would leak its "
                "request"
            ) from exc
    for module, name, function in found:
        if not getattr(function, _MARK, False):
            setattr(module, name, _handing_off(function))


def _handing_off(function: Any) -> Any:
    """`function` handing a coroutine it returns in a worker thread (no running event
    loop: an executor's) to the `guarding_handoffs` block it runs in."""

    @functools.wraps(function)
    def handing_off(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        handoffs = _BLOCK.get()
        if handoffs is not None and inspect.iscoroutine(result) and not _on_a_loop():
            handoffs.take(result)
        return result

    setattr(handing_off, _MARK, True)
    return handing_off


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
