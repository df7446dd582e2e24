"""An httpx transport through a proxy that never answers CONNECT fails at the connect
timeout `bound_tunnel` gives it, sync and async (gateway/upstream/hosted_tunnel.py); a
proxy that answers is tunnelled through as before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from gateway.upstream.hosted_tunnel import bound_tunnel
from tests.helpers.silent_server import SilentServer, silent_server

CONNECT_S = 0.3
READ_S = 120.0  # the request's read timeout: what read the CONNECT answer before


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    with silent_server() as proxy:
        yield proxy


def _timeout() -> httpx.Timeout:
    return httpx.Timeout(READ_S, connect=READ_S)


def test_a_silent_proxy_fails_a_sync_request_at_the_connect_timeout(silent: SilentServer) -> None:
    transport = bound_tunnel(httpx.HTTPTransport(proxy=silent.url), lambda: CONNECT_S)
    client = httpx.Client(transport=transport, timeout=_timeout())
    with client, pytest.raises(httpx.ConnectTimeout):
        client.get("https://provider.invalid/v1/models")
    assert silent.closed.acquire(timeout=30)  # the connection was given up


def test_a_silent_proxy_fails_an_async_request_at_the_connect_timeout(silent: SilentServer) -> None:
    async def ask() -> None:
        transport = bound_tunnel(httpx.AsyncHTTPTransport(proxy=silent.url), lambda: CONNECT_S)
        async with httpx.AsyncClient(transport=transport, timeout=_timeout()) as client:
            with pytest.raises(httpx.ConnectTimeout):
                await client.get("https://provider.invalid/v1/models")

    asyncio.run(asyncio.wait_for(ask(), 30))
    assert silent.closed.acquire(timeout=30)


def test_a_proxy_refusing_connect_is_still_its_answer() -> None:
    with silent_server(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n") as proxy:
        transport = bound_tunnel(httpx.HTTPTransport(proxy=proxy.url), lambda: CONNECT_S)
        client = httpx.Client(transport=transport, timeout=_timeout())
        with client, pytest.raises(httpx.ProxyError, match="403"):
            client.get("https://provider.invalid/v1/models")
