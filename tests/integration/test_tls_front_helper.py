"""The test helper `TLSFront` (tests/helpers/tls.py) stops cleanly with a relay running.

A relay whose backend side stays open (a keep-alive backend) is still running when the
front stops, and is cancelled. On Python 3.11 the stream server's done callback asks a
cancelled task for its exception, which raises: asyncio logged "Exception in callback
StreamReaderProtocol.connection_made" at the end of tests that used the front.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from pathlib import Path

import pytest

from tests.helpers.tls import Pki, TLSFront, server_context
from tests.helpers.waiting import until


def test_stopping_the_front_with_a_relay_running_logs_no_asyncio_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = Pki.create(tmp_path)
    backend = socket.create_server(("127.0.0.1", 0))  # accepts, then never answers
    accepted: list[socket.socket] = []

    def accept() -> None:
        backend.settimeout(30)
        accepted.append(backend.accept()[0])

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    front = TLSFront(backend.getsockname()[:2], server_context(pki, pki.server())).start()
    client = ssl.create_default_context(cadata=pki.ca.cert_pem.decode("ascii"))
    try:
        with (
            caplog.at_level(logging.ERROR, logger="asyncio"),
            socket.create_connection(("127.0.0.1", front.port), timeout=30) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            acceptor.join(30)
            assert accepted, "the front did not connect to the backend"
            until(lambda: front.handshakes == 1, "the front to count the handshake", timeout=30)
            front.stop()  # the relay is running: the client and the backend are open
    finally:
        for sock in accepted:
            sock.close()
        backend.close()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
