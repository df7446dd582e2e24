"""`owngate audit` copying an https log: a server that stalls the TLS handshake, or drips
a file's head or body, is cut off at the per-file deadline, as a plain-http one is
(gateway/provenance/audit/remote_socket.py `Watch`).

The watchdog shut the connection's socket object down at the deadline, but TLS had
detached that object as it wrapped the socket (its descriptor moved to the `SSLSocket`),
so the shutdown did nothing: a log server that accepted and never answered the handshake
held each file for the read timeout (30 s by default), and one dripping a response head a
byte within every read timeout held the auditor past every deadline (a body's reads check
the clock themselves).
"""

from __future__ import annotations

import errno
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance.audit.remote import FetchLimits, mirror_log
from tests.helpers.silent_server import SilentServer, silent_server
from tests.helpers.tls import Pki, server_context

DEADLINE_S = 0.5
READ_S = 120.0  # each read's timeout: far past the deadline, and past the test's wait
WAIT_S = 60.0  # half the read timeout: a copy that waits for it fails here


class _Server(SilentServer):
    """A TLS server on loopback: each connection gets a handshake with `context`, its
    request read and a response head that drips a byte at a time (one header line, never
    ended) until the client goes."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._context = context
        self.dripped = threading.Event()
        self._stop = threading.Event()
        super().__init__()  # accepting from here

    def _serve(self, conn: socket.socket) -> None:
        try:
            with self._context.wrap_socket(conn, server_side=True) as tls:
                while b"\r\n\r\n" not in tls.recv(65536):
                    pass  # the request head (one read on loopback)
                tls.sendall(b"HTTP/1.1 200 OK\r\nx-slow: ")
                while not self._stop.is_set():  # bounded: until the client goes
                    tls.sendall(b"y")
                    self.dripped.set()
                    self._stop.wait(0.01)  # the server's pace, not a wait for the client
        except OSError:
            pass  # the client shut the connection: what the test wants

    def close(self) -> None:
        self._stop.set()
        super().close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    with silent_server() as server:
        yield server


@pytest.fixture
def dripping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    pki = Pki.create(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.directory / "ca.pem"))  # the system's roots
    server = _Server(server_context(pki, pki.server("127.0.0.1")))
    try:
        yield server
    finally:
        server.close()


def _copy(url: str, directory: Path) -> list[BaseException]:
    """What `mirror_log` raised copying `url`, waited for at most `WAIT_S`."""
    raised: list[BaseException] = []
    limits = FetchLimits(read_timeout_s=READ_S, file_deadline_s=DEADLINE_S)

    def run() -> None:
        try:
            mirror_log(url, directory, limits=limits)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    copying = threading.Thread(target=run, daemon=True)
    copying.start()
    copying.join(WAIT_S)
    assert not copying.is_alive(), "the copy outlived its per-file deadline"
    return raised


def test_a_log_server_that_never_finishes_the_handshake_is_cut_off_at_the_deadline(
    silent: SilentServer, tmp_path: Path
) -> None:
    raised = _copy(f"https://127.0.0.1:{silent.port}/log/", tmp_path / "copy")
    assert len(raised) == 1 and isinstance(raised[0], OSError), raised
    assert f"not received whole within {DEADLINE_S:g} s" in str(raised[0])
    assert silent.closed.acquire(timeout=WAIT_S)  # the connection was given up, not left open


def test_a_log_server_dripping_an_https_head_is_cut_off_at_the_deadline(
    dripping: _Server, tmp_path: Path
) -> None:
    raised = _copy(f"https://127.0.0.1:{dripping.port}/log/", tmp_path / "copy")
    assert dripping.dripped.is_set()  # the handshake went through: the head dripped
    assert len(raised) == 1 and isinstance(raised[0], OSError), raised
    assert f"not received whole within {DEADLINE_S:g} s" in str(raised[0])


def test_a_watch_that_cannot_hold_the_socket_closes_it(
    silent: SilentServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Out of descriptors, the watch's duplicate of a new socket fails: the copy fails, and
    # the socket is closed then, never connected (the watch holds it before its connect),
    # not held by the error's traceback.
    def no_duplicate(self: socket.socket) -> socket.socket:
        raise OSError(errno.EMFILE, "Too many open files")

    made: list[socket.socket] = []
    connected: list[Any] = []
    real_socket, real_connect = socket.socket.__init__, socket.socket.connect

    def made_here(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        real_socket(self, *args, **kwargs)
        made.append(self)

    def connect(self: socket.socket, peer: Any) -> None:
        connected.append(peer)
        real_connect(self, peer)

    with monkeypatch.context() as patched:
        patched.setattr(socket.socket, "dup", no_duplicate)
        patched.setattr(socket.socket, "__init__", made_here)
        patched.setattr(socket.socket, "connect", connect)
        raised = _copy(f"http://127.0.0.1:{silent.port}/log/", tmp_path / "copy")
    assert len(raised) == 1 and "Too many open files" in str(raised[0]), raised
    assert connected == []
    assert made and all(sock.fileno() == -1 for sock in made)  # closed
