"""Closing a TLS connection on the sidecar's listener (`gateway.attest.listener`): the
sidecar waits for the client's close_notify at most `SHUTDOWN_TIMEOUT_S`, not the loop's
default 30 s, during which a client that never answers kept its place under the
connection cap. Here the wait is made tiny and ordered against a later, longer timer of
the same loop (a silent handshake's timeout): the idle connection must be gone by then.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.attest import AttestSettings, AttestThread, listener_context
from gateway.attest.listener import SHUTDOWN_TIMEOUT_S
from gateway.config.schema import ListenSettings
from gateway.pki import issue, make_ca
from gateway.provenance import write_signing_key
from tests.helpers.gateways import Sim
from tests.helpers.raw_socket import parse, read_to_end
from tests.helpers.waiting import until

WAIT_S = 60.0  # the most the test waits for anything
TINY_S = 0.1  # the shutdown timeout here: far below the handshake timeout below


def _contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The sidecar's server context, and a client context that trusts it."""
    now = datetime.now(UTC)
    ca = make_ca("test CA", now=now, days=1)
    issued = issue(ca, "sidecar.test", now=now, days=1)
    cert, key = tmp_path / "sidecar.pem", tmp_path / "sidecar-key.pem"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    return listener_context(cert, key), ssl.create_default_context(cafile=tmp_path / "ca.pem")


@pytest.fixture
def sidecar(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[tuple[AttestThread, ssl.SSLContext]]:
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
    server, client = _contexts(tmp_path)
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    settings = AttestSettings(backend=sim.url, key_file=key, log_dir=tmp_path / "log")
    # Idle connections close at once; a handshake may take 3 s (the later, longer timer).
    listen = ListenSettings(keepalive_timeout_s=0.05, header_timeout_s=3.0)
    thread = AttestThread(
        settings, ssl_context=server, listen=listen, tls_shutdown_timeout_s=TINY_S
    ).start()
    yield thread, client
    thread.stop()


def _read_answer(sock: ssl.SSLSocket) -> bytes:
    """One whole answer with a content-length, and not a byte more."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(parse(head + b"\r\n\r\n")[1]["content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_the_shutdown_timeout_is_a_few_seconds() -> None:
    assert 1.0 <= SHUTDOWN_TIMEOUT_S <= 10.0


def test_a_client_that_never_answers_close_notify_frees_its_place(
    sidecar: tuple[AttestThread, ssl.SSLContext],
) -> None:
    thread, client = sidecar
    listener = thread.listener
    raw = socket.create_connection((thread.host, thread.port), timeout=WAIT_S)
    with client.wrap_socket(raw, server_hostname="sidecar.test") as idle:
        idle.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _read_answer(idle).startswith(b"HTTP/1.1 200 ")
        # The client now reads nothing more: the sidecar's close_notify stays unanswered.

        def closing() -> bool:  # the keep-alive close began (or is already over)
            return all(c.transport.is_closing() for c in list(listener.connections))

        until(closing, "the idle connection closed by the sidecar", timeout=WAIT_S)
        # A later timer of the same loop, three seconds long: a handshake that never
        # starts. By the time it fires the tiny shutdown timeout has dropped the idle
        # connection; with the loop's default 30 s it was still held.
        with socket.create_connection((thread.host, thread.port), timeout=WAIT_S) as silent:
            assert read_to_end(silent) == b""
        assert list(listener.connections) == []
