"""`dropped_sockets` names a socket left open in a reference cycle, and only that one."""

from __future__ import annotations

import gc
import socket
import warnings
from typing import Any

from tests.helpers.dropped_sockets import dropped_sockets


class _Cycle:
    """Holds a socket and itself: only the collector frees it. `__del__` closes the
    socket, as an OpenAI SDK client's does, unless the collector finalizes the socket
    first (which then warns): either way it was left open."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.me: Any = self

    def __del__(self) -> None:
        self.sock.close()


def test_a_socket_left_open_in_a_cycle_is_named_and_closed_kept_ones_are_not() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        gc.disable()  # the cycle stays until the helper's own collection
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with dropped_sockets() as dropped:
                    kept = socket.create_connection(listener.getsockname())
                    closed = socket.create_connection(listener.getsockname())
                    closed.close()
                    left = socket.create_connection(listener.getsockname())
                    left_name = repr(left)
                    _Cycle(left)
                    del left
        finally:
            gc.enable()
        assert dropped == [left_name]
        kept.close()
    finally:
        listener.close()
