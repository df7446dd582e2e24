"""Each tenant's share of a private backend's connections (gateway/upstream/tenant_share.py).

A pool of 4 with a share of 1 per tenant: `acme` holding one connection is `busy` at once
for a second, while `other` (and the gateway's own probes, no tenant) still get one.
Every way a connection's use ends gives the share back: a loop runs each of them many
times with the share at one connection, so a single path that leaked would leave `acme`
`busy` on the next round.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream.http import HttpPool, UpstreamError
from tests.helpers.scripted_upstream import read_request, with_backend

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
ROUNDS = 12  # each path taken this many times: a leak of one exhausts the share of one


async def scripted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep-alive; what it answers depends on the request's path."""
    while True:
        request = await read_request(reader)
        path = request.split(b" ", 2)[1]
        if path == b"/ok":
            writer.write(OK)
        elif path == b"/stream":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(b"1\r\na\r\n1\r\nb\r\n0\r\n\r\n")
        elif path == b"/held":  # one chunk, then nothing more (a stream still decoding)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
            await writer.drain()
            await asyncio.Event().wait()
        elif path == b"/cut":  # promises 10 bytes, sends 2, closes
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}")
            await writer.drain()
            return
        elif path == b"/drop":  # closes before answering (a reused one: `request` retries)
            return
        elif path == b"/silent":
            await asyncio.Event().wait()
        await writer.drain()


def test_a_tenant_past_its_share_is_busy_and_another_tenant_still_gets_a_connection() -> None:
    async def body(pool: HttpPool) -> None:
        held = await pool.request(b"GET", b"/held", [], b"", tenant="acme")
        with pytest.raises(UpstreamError) as refused:
            await pool.request(b"GET", b"/ok", [], b"", tenant="acme")
        assert refused.value.kind == "busy"
        assert "acme" not in str(refused.value)
        with pytest.raises(UpstreamError) as leased:
            await pool.connect("acme")
        assert leased.value.kind == "busy"
        theirs = await pool.request(b"GET", b"/ok", [], b"", tenant="other")
        assert await theirs.read() == b"{}"
        probe = await pool.request(b"GET", b"/ok", [], b"")  # the gateway's own: no tenant
        assert await probe.read() == b"{}"
        assert pool.share.held("acme") == 1
        held.abort()
        assert pool.share.held("acme") == 0

    asyncio.run(with_backend(scripted, body, max_connections=4, tenant_cap=1))


def test_every_way_a_connections_use_ends_gives_the_tenants_share_back() -> None:
    async def body(pool: HttpPool) -> None:
        async def ask(path: bytes, **options: object) -> bytes:
            response = await pool.request(b"GET", path, [], b"", tenant="acme", **options)  # type: ignore[arg-type]
            return await response.read()

        for _ in range(ROUNDS):
            assert await ask(b"/ok") == b"{}"  # read to its end: back idle
            response = await pool.request(b"GET", b"/stream", [], b"", tenant="acme")
            assert b"".join([chunk async for chunk in response.chunks()]) == b"ab"
            response = await pool.request(b"GET", b"/held", [], b"", tenant="acme")
            async for _chunk in response.chunks():
                break
            response.abort()  # the client went away mid-stream
            with pytest.raises(UpstreamError) as cut:
                await ask(b"/cut")  # the backend broke off the body
            assert cut.value.kind == "closed"
            with pytest.raises(UpstreamError) as dropped:
                await ask(b"/drop")  # closed before answering: reconnects, closed again
            assert dropped.value.kind == "closed"
            with pytest.raises(UpstreamError) as late:
                await ask(b"/silent", first_byte_timeout=0.01)
            assert late.value.kind == "timeout"
            task = asyncio.create_task(ask(b"/silent"))
            for _turn in range(10_000):  # until it holds its connection
                if pool.share.held("acme") or task.done():
                    break
                await asyncio.sleep(0)
            assert pool.share.held("acme") == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            unused = await pool.connect("acme")
            unused.release()  # leased, never used
            leased = await pool.connect("acme")
            response = await pool.request(b"GET", b"/ok", [], b"", connection=leased)
            assert await response.read() == b"{}"  # the lease and its request: one share
            assert pool.share.held("acme") == 0

    asyncio.run(
        asyncio.wait_for(
            with_backend(scripted, body, max_connections=4, tenant_cap=1, first_byte_timeout=5),
            60,
        )
    )
