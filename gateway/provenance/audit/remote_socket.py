"""The connection of one GET of a log copy (gateway/provenance/audit/remote.py), held to
the file's deadline from its name lookup on: the `Watch` shuts its socket down at the
deadline (waking a blocked read, whatever its timeout), and the lookup of its host name is
waited for only until then.

`socket.create_connection` (what urllib's connections call) looks the name up with a
blocking `getaddrinfo`, which no timeout of a socket's and no watchdog reaches (there is no
socket yet): a log URL whose DNS server swallowed queries held `owngate audit` for the
resolver's own timeouts, past `--file-deadline` and `--copy-deadline`, however short they
were set (a resolver that never answers: for ever). Here the name is looked up on a daemon
thread of its own, which the watch's deadline stops waiting for (the thread is left to the
resolver: it holds nothing of the copy, and the process may exit without it), and each of
its addresses is connected, its socket held by the watch from before its connect (a
connect to an address that drops SYNs is woken at the deadline too: before, each address
took up to the read timeout, however many the name had, past every deadline).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from typing import Any

__all__ = ["Watch", "watched"]


class Watch:
    """The socket of one GET, shut down at its deadline (waking a blocked read, whatever its
    timeout) through a duplicate of its descriptor: TLS detaches the socket object it wraps;
    and its name lookup, no longer waited for from then."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._waking: threading.Event | None = None  # a lookup being waited for
        self.expired = False

    def attach(self, sock: socket.socket) -> None:
        self.release()  # a redirect's earlier connection, or an address tried before
        with self._lock:
            self._socket = sock.dup()
        if self.expired:
            self.expire()

    def expire(self) -> None:
        with self._lock, contextlib.suppress(OSError):  # closed: nothing left to wake
            self.expired = True
            if self._waking is not None:
                self._waking.set()
            if self._socket is not None:
                self._socket.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        with self._lock:
            sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()

    def look_up(self, host: str, port: int) -> list[Any]:
        """`getaddrinfo(host, port)` for a TCP connection, waited for until the deadline
        (then OSError, the lookup's thread left running)."""
        done = threading.Event()
        answer: list[Any] = []

        def run() -> None:
            try:
                answer.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting GET
                answer.append(exc)
            finally:
                done.set()

        with self._lock:
            if self.expired:
                raise OSError(f"{host}: past the deadline before its name was looked up")
            self._waking = done
        try:
            threading.Thread(target=run, name="owngate-audit-dns", daemon=True).start()
            done.wait()  # set by the lookup, or by `expire` at the deadline
        finally:
            with self._lock:
                self._waking = None
        if not answer:
            raise OSError(f"{host}: its name was not looked up before the deadline")
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return list(answer[0])

    def connect(
        self, address: tuple[str, int], timeout: Any, source: tuple[str, int] | None
    ) -> socket.socket:
        """`socket.create_connection(address, timeout, source)`, its lookup waited for
        within the deadline (`look_up`), the socket connected held by the watch."""
        host, port = address
        failure: OSError | None = None
        for family, kind, proto, _name, peer in self.look_up(host, port):
            sock = socket.socket(family, kind, proto)
            try:
                # held before it connects: the deadline's shutdown wakes a connect that
                # hangs (an address that drops SYNs), each address tried within the deadline
                self.attach(sock)
            except BaseException:  # its duplicate failed (EMFILE): closed, never connected
                sock.close()
                raise
            try:
                if self.expired:
                    raise OSError(f"{host}: past the deadline before it was connected")
                if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                    sock.settimeout(timeout)
                if source is not None:
                    sock.bind(source)
                sock.connect(peer)
            except OSError as exc:
                self.release()
                sock.close()
                if self.expired:
                    raise
                failure = exc
                continue
            except BaseException:
                self.release()
                sock.close()
                raise
            return sock
        raise failure if failure is not None else OSError(f"{host}: no address to connect to")


def watched(base: type[http.client.HTTPConnection], watch: Watch) -> Any:
    """`base` whose connections `watch` holds from their name lookup on (their TLS
    handshake's too)."""

    class Watched(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = self._connect_watched

        def _connect_watched(self, *args: Any, **kwargs: Any) -> socket.socket:
            address, timeout, *rest = args
            source = rest[0] if rest else kwargs.get("source_address")
            return watch.connect(address, timeout, source)

    return Watched
