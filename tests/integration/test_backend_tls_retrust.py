"""A reload that replaces a backend's TLS settings while a connection to it is being made.

The connection was authenticated under the settings a reload retired, so it is not used;
but the backend did nothing wrong. Failed as `tls`, the attempt opened the backend's
breaker at once (a refused certificate does) and the request went on to the next backend
or, with every private one failed, to a hosted provider: a routine CA rotation took a
healthy backend out and pushed requests in flight off the private tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from pathlib import Path

from gateway.config.schema import BackendSettings
from gateway.upstream.http import HttpPool
from gateway.upstream.tls import backend_tls
from tests.helpers.gateways import backend
from tests.helpers.tls import Pki, server_context

_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"


def test_a_reload_during_the_handshake_connects_again_under_the_new_settings(
    tmp_path: Path,
) -> None:
    pki = Pki.create(tmp_path / "ca")
    context = server_context(pki, pki.server())
    settings = BackendSettings.model_validate(
        backend("gpu", "https://127.0.0.1:1", "m", tls={"ca_file": str(pki.directory / "ca.pem")})
    )

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted, go = threading.Event(), threading.Event()
    connections: list[socket.socket] = []

    def serve() -> None:
        """Two connections at most: the first handshake waits until `go` is set."""
        listener.settimeout(10)
        with contextlib.suppress(OSError):
            for _ in range(2):
                sock, _ = listener.accept()
                connections.append(sock)
                accepted.set()
                go.wait(10)
                sock.settimeout(10)
                with (
                    contextlib.suppress(OSError),
                    context.wrap_socket(sock, server_side=True) as tls,
                ):
                    request = b""
                    while not request.endswith(b"\r\n\r\n{}") and len(request) < 4096:
                        data = tls.recv(4096)
                        if not data:
                            break
                        request += data
                    if request.endswith(b"{}"):
                        tls.sendall(_ANSWER)
                        return

    async def run() -> int:
        pool = HttpPool(
            "127.0.0.1",
            port,
            tls=backend_tls(settings, "127.0.0.1", tmp_path),
            connect_timeout=5,
            first_byte_timeout=5,
            read_timeout=5,
            max_connections=2,
        )
        try:
            request = asyncio.create_task(pool.request(b"POST", b"/", [], b"{}"))
            assert await asyncio.to_thread(accepted.wait, 10)
            # A reload rebuilt the backend's TLS settings (a CA file rewritten).
            pool.retrust(backend_tls(settings, "127.0.0.1", tmp_path))
            go.set()
            async with asyncio.timeout(10):
                response = await request
                await response.read()
            return response.status
        finally:
            await pool.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        status = asyncio.run(run())
    finally:
        listener.close()
        server.join(10)
    assert status == 200  # not UpstreamError("tls"), which opened the breaker at once
    assert len(connections) == 2  # the first, made under the retired settings, was not used
