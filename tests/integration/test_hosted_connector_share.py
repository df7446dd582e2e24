"""Hosted providers' connections count in the process's share (gateway/upstream/hosted_sockets.py).

LiteLLM's aiohttp connectors kept every connection a hosted call gave back for 15 s, up to
1,000, counted by nothing of the gateway's (tests/integration/test_hosted_sockets.py is
the attack end to end). Now each connector joins the process's `BackendSockets`: its
connections, idle ones included, count with the private pools'; one opened at the limit
first closes an idle one (a private pool's first, then the hosted one idle longest), and
a hosted call still reuses its idle connection (no new handshake per call).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.upstream import sockets as sockets_module
from gateway.upstream.http import HttpPool
from gateway.upstream.litellm_runtime import aclose_litellm_clients
from gateway.upstream.openai_wire import Endpoint
from gateway.upstream.sockets import BackendSockets
from tests.helpers.audit_rig import ANSWER, USAGE
from tests.helpers.descriptor_rounds import hosted_client
from tests.helpers.raw_backend import Post, RawBackend
from tests.helpers.waiting import until

CHAT = {"model": "public", "messages": [{"role": "user", "content": "hi"}]}
TEXT = {"model": "public", "prompt": "hi"}
TEXT_ANSWER = b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi",'
TEXT_ANSWER += b'"finish_reason":"stop"}],"usage":' + USAGE + b"}"


async def _kept_alive(writer: asyncio.StreamWriter, post: Post) -> bool:
    body = TEXT_ANSWER if post.head.startswith(b"POST /v1/completions ") else ANSWER
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    writer.write(head % len(body) + body)
    await writer.drain()
    return True  # the connection stays open for the next request


class _Together:
    """Answers kept alive; the first `together` only once all of them arrived, so that
    they come on as many connections."""

    def __init__(self, together: int) -> None:
        self.together = together
        self.arrived = 0
        self.all_in: asyncio.Event | None = None  # made on the backend's loop

    async def __call__(self, writer: asyncio.StreamWriter, post: Post) -> bool:
        if self.all_in is None:
            self.all_in = asyncio.Event()
        self.arrived += 1
        if self.arrived == self.together:
            self.all_in.set()
        if self.arrived <= self.together:
            await self.all_in.wait()
        return await _kept_alive(writer, post)


def _share(monkeypatch: pytest.MonkeyPatch, limit: int) -> BackendSockets:
    """A share of `limit` that the hosted connectors made from now on join."""
    sockets = BackendSockets(limit)
    monkeypatch.setattr(sockets_module, "_HOSTED_SHARE", [sockets], raising=False)
    return sockets


def _pool(port: int, sockets: BackendSockets) -> HttpPool:
    return HttpPool(
        "127.0.0.1",
        port,
        connect_timeout=5.0,
        first_byte_timeout=5.0,
        read_timeout=5.0,
        max_connections=8,
        sockets=sockets,
    )


@pytest.mark.parametrize(("endpoint", "request_doc"), [("chat", CHAT), ("completions", TEXT)])
def test_a_hosted_call_s_idle_connection_is_counted_and_reused(
    monkeypatch: pytest.MonkeyPatch, endpoint: Endpoint, request_doc: dict[str, Any]
) -> None:
    """Through LiteLLM as the gateway calls it: the connection a call gave back stays
    open, idle, and the next call takes it (one connection for both); but it is in the
    share (of 1): a private pool opening a connection closes it. `completions`: LiteLLM's
    text-completion handler on the OpenAI SDK client the gateway hands it
    (`no_redirect_http_client`), whose httpx pool kept up to 100 idle ones uncounted."""
    provider = RawBackend(_kept_alive).start()
    sockets = _share(monkeypatch, 1)
    client = hosted_client("127.0.0.1", provider.port)
    pool = _pool(provider.port, sockets)

    async def calls() -> None:
        try:
            for _ in range(2):
                await client.send(endpoint, request_doc, "public")
            assert (provider.connections, provider.ended) == (1, 0)  # kept alive, reused
            answer = await pool.request(b"POST", b"/v1/chat/completions", [], b"{}")
            assert await answer.read() == ANSWER
            # the loop keeps running (the close happens on it) while a thread waits
            done = "the idle hosted connection closed for the private one"
            await asyncio.to_thread(until, lambda: provider.ended == 1, done)
            assert provider.connections == 2
        finally:
            await pool.close()
            await client.aclose()
            await aclose_litellm_clients()

    try:
        asyncio.run(calls())
    finally:
        provider.stop()


def test_hosted_and_private_connections_make_room_for_each_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A share of 2: a private pool opening a connection while two hosted ones sit idle
    closes the older of them; a hosted connection opened then (to another host) closes
    the private one, idle, before the hosted one left."""
    provider = RawBackend(_Together(2)).start()
    sockets = _share(monkeypatch, 2)

    from gateway.upstream.hosted_sockets import CountedConnector  # imports aiohttp

    async def run() -> None:
        connector = CountedConnector()
        session = aiohttp.ClientSession(connector=connector)
        pool = _pool(provider.port, sockets)
        url = f"http://127.0.0.1:{provider.port}/v1/chat/completions"
        try:
            held = await asyncio.gather(*(session.post(url, data=b"{}") for _ in range(2)))
            for response in held:  # both given back, idle
                assert await response.read() == ANSWER
            assert (connector.open_count(), sockets.total()) == (2, 2)
            answer = await pool.request(b"POST", b"/v1/chat/completions", [], b"{}")
            assert await answer.read() == ANSWER
            assert (connector.open_count(), pool.open_connections) == (1, 1)
            assert sockets.total() == 2
            other = url.replace("127.0.0.1", "localhost")  # another host: a new connection
            async with session.post(other, data=b"{}") as response:
                assert await response.read() == ANSWER
            assert (connector.open_count(), pool.open_connections) == (2, 0)
            assert sockets.total() == 2
            assert provider.connections == 4
        finally:
            await pool.close()
            await session.close()

    try:
        asyncio.run(run())
    finally:
        provider.stop()
