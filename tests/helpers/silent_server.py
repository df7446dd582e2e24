"""A TCP server on loopback that accepts each connection and never answers it: a provider
that stalls the TLS handshake, a proxy that never answers CONNECT, a log server that never
speaks. Each connection is read until its peer closes it (or resets it): `accepted` counts
the connections, `heard` is set once one sends a CONNECT, `closed` is released once per
connection its peer gave up. With `answer`, a CONNECT is answered with those bytes and the
connection then closed (a proxy that refuses)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

__all__ = ["SilentServer", "silent_server"]


class SilentServer:
    def __init__(self, answer: bytes | None = None) -> None:
        self._answer = answer
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted = 0
        self.heard = threading.Event()  # a CONNECT arrived
        self.closed = threading.Semaphore(0)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """One accepted connection, on a thread of its own (a subclass serves it its way)."""
        with conn:
            try:
                while data := conn.recv(65536):  # a ClientHello or a CONNECT, then nothing
                    if data.startswith(b"CONNECT "):
                        self.heard.set()
                        if self._answer is not None:
                            conn.sendall(self._answer)
                            break
            except OSError:
                pass  # the peer reset it: given up too
        self.closed.release()

    def close(self) -> None:
        self._server.close()


@contextlib.contextmanager
def silent_server(answer: bytes | None = None) -> Iterator[SilentServer]:
    """A `SilentServer`, closed on the way out."""
    server = SilentServer(answer)
    try:
        yield server
    finally:
        server.close()
