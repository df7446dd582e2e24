"""A hosted provider's connection opens within `limits.connect_timeout_s`, TLS handshake
included, as a private backend's does (gateway/upstream/hosted_sockets.py).

LiteLLM hands aiohttp its `timeout` (the first-byte timeout, 120 s by default) for
connecting, and the event loop gives a TLS handshake 60 s of its own: a provider address
that accepted the connection and never answered the handshake (a stuck load balancer, a
firewall that swallows, a plain-HTTP port behind an `https://` URL) held every attempt a
minute before it failed over, and its client with it (the secret canary sweep's `tls`
backend timed a 60 s client out in CI).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS, Gateway, hosted_backend

pytestmark = LITELLM_WARNINGS

CONNECT_S = 0.5
CLIENT_S = 30.0  # half the handshake's own minute: a gateway that waits for it fails here


class _Silent:
    """A TCP server that accepts and never writes a byte: each connection is read until
    its peer closes it (`closed` counts those)."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.accepted = 0
        self.closed = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            thread = threading.Thread(target=self._drain, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _drain(self, conn: socket.socket) -> None:
        with conn:
            try:
                while conn.recv(65536):
                    pass  # the ClientHello, then nothing
            except OSError:
                pass
        self.closed.release()

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def silent() -> Iterator[_Silent]:
    server = _Silent()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_provider_that_never_finishes_the_handshake_fails_at_the_connect_timeout(
    silent: _Silent, start_gateway: Callable[..., Gateway], tmp_path: Path, stream: bool
) -> None:
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", f"https://127.0.0.1:{silent.port}/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"connect_timeout_s": CONNECT_S},  # the first-byte timeout stays 120 s
    )
    ask = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=CLIENT_S
    )
    assert response.status_code in (502, 503, 504), response.text
    assert response.json()["error"]["type"], response.text
    assert silent.accepted >= 1  # the provider's address was reached: the handshake stalled
    # and the gateway gave the connection up (not left it open for the handshake's minute)
    assert silent.closed.acquire(timeout=CLIENT_S)
