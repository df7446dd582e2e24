"""A witness that answers badly, on a loopback socket in a thread: `HostileWitness`.

Each connection's request (head and body) is read, then `answer(send)` runs: it writes
what it likes with `send(bytes)` (False once the peer has gone) and returns; the
connection then stays open until the peer closes it (a witness that never ends its
answer) or the helper stops. Every connection is counted (`connections`), so a test can
tell a client that was redirected elsewhere from one that was not. Bounded: an answer
writes what its script says and no more, each blocking call times out.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

__all__ = ["Answer", "HostileWitness"]

#: writes an answer: `send(data)` is False once the peer closed or reset the connection
Answer = Callable[[Callable[[bytes], bool]], None]
_WAIT_S = 30.0  # the most one connection is held open


class HostileWitness:
    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/w"
        self.connections = 0
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> HostileWitness:
        self._accepting.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(_WAIT_S)
            try:
                _read_request(conn)
            except OSError:
                return

            def send(data: bytes) -> bool:
                if self._stopped.is_set():
                    return False
                try:
                    conn.sendall(data)
                except OSError:
                    return False
                return True

            self._answer(send)
            conn.settimeout(0.2)
            for _ in range(int(_WAIT_S / 0.2)):  # held until the peer closes, bounded
                if self._stopped.is_set():
                    return
                try:
                    if not conn.recv(4096):
                        return
                except TimeoutError:
                    continue
                except OSError:
                    return


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(4096)
        if not part or len(data) > 1 << 20:
            return
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < min(length, 1 << 20):
        part = conn.recv(65536)
        if not part:
            return
        body += part
