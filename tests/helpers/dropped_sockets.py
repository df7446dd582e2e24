"""Sockets a test let go of while they were still open.

A socket dropped open by reference count warns at once (`ResourceWarning`, an error
here). One held by a reference cycle (an OpenAI SDK client: its resources point back at
it) stays open until some later garbage collection, in whichever test that happens to
run, or at session end, where pytest fails the run after every test passed; and whether
it warns then depends on the order the collector finalizes the cycle in (the client's
`__del__` may close it first). `dropped_sockets()` tells it at the test that made it,
every time: it notes every socket made in the block, and as the block ends the ones
still open that one collection then frees are named (the warnings that collection's
finalizers raise for them are taken, not left to fail whichever test comes next).
"""

from __future__ import annotations

import gc
import socket
import sys
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["dropped_sockets"]


@contextmanager
def dropped_sockets() -> Iterator[list[str]]:
    """Yield a list that, once the block has ended, names each socket made in it (any
    thread) that was still open then and that nothing but garbage held."""
    made: weakref.WeakSet[socket.socket] = weakref.WeakSet()
    init = socket.socket.__init__

    def noting(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.add(self)

    dropped: list[str] = []
    socket.socket.__init__ = noting  # type: ignore[method-assign]
    try:
        yield dropped
    finally:
        socket.socket.__init__ = init  # type: ignore[method-assign]
    still_open = [(weakref.ref(s), id(s), repr(s)) for s in list(made) if s.fileno() != -1]
    ours = {ident for _, ident, _ in still_open}
    hook = sys.unraisablehook

    def taken(unraisable: Any) -> None:
        # One of these sockets freed open: named below; anything else to pytest's hook.
        if not (
            isinstance(unraisable.exc_value, ResourceWarning) and id(unraisable.object) in ours
        ):
            hook(unraisable)

    sys.unraisablehook = taken
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)  # to `taken`, never printed
            gc.collect()
    finally:
        sys.unraisablehook = hook
    dropped.extend(name for ref, _, name in still_open if ref() is None)
