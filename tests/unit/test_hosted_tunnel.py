"""An httpx transport through a proxy that never answers CONNECT fails at the connect
timeout `bound_tunnel` gives it, sync and async (gateway/upstream/hosted_tunnel.py); a
proxy that answers is tunnelled through as before."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from gateway.upstream.hosted_tunnel import bound_tunnel

CONNECT_S = 0.3
READ_S = 120.0  # the request's read timeout: what read the CONNECT answer before


class _Proxy:
    """A TCP server reading each connection until its peer closes it; with `answer`, it
    answers a CONNECT with that and then closes."""

    def __init__(self, answer: bytes | None = None) -> None:
        self._answer = answer
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self.closed = threading.Semaphore(0)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    if self._answer is not None and data.startswith(b"CONNECT "):
                        conn.sendall(self._answer)
                        break
            except OSError:
                pass
        self.closed.release()

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def silent() -> Iterator[_Proxy]:
    proxy = _Proxy()
    try:
        yield proxy
    finally:
        proxy.close()


def _timeout() -> httpx.Timeout:
    return httpx.Timeout(READ_S, connect=READ_S)


def test_a_silent_proxy_fails_a_sync_request_at_the_connect_timeout(silent: _Proxy) -> None:
    transport = bound_tunnel(httpx.HTTPTransport(proxy=silent.url), lambda: CONNECT_S)
    client = httpx.Client(transport=transport, timeout=_timeout())
    with client, pytest.raises(httpx.ConnectTimeout):
        client.get("https://provider.invalid/v1/models")
    assert silent.closed.acquire(timeout=30)  # the connection was given up


def test_a_silent_proxy_fails_an_async_request_at_the_connect_timeout(silent: _Proxy) -> None:
    async def ask() -> None:
        transport = bound_tunnel(httpx.AsyncHTTPTransport(proxy=silent.url), lambda: CONNECT_S)
        async with httpx.AsyncClient(transport=transport, timeout=_timeout()) as client:
            with pytest.raises(httpx.ConnectTimeout):
                await client.get("https://provider.invalid/v1/models")

    asyncio.run(asyncio.wait_for(ask(), 30))
    assert silent.closed.acquire(timeout=30)


def test_a_proxy_refusing_connect_is_still_its_answer() -> None:
    proxy = _Proxy(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
    try:
        transport = bound_tunnel(httpx.HTTPTransport(proxy=proxy.url), lambda: CONNECT_S)
        client = httpx.Client(transport=transport, timeout=_timeout())
        with client, pytest.raises(httpx.ProxyError, match="403"):
            client.get("https://provider.invalid/v1/models")
    finally:
        proxy.close()
