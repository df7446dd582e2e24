"""A stream relayed through the public listener goes out by its `BodyWriter`
(gateway/body_writer.py), chunk by chunk from the backend connection's callbacks, and
the log still commits to exactly the bytes the client got."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.body_writer import BodyWriter
from gateway.upstream.response import UpstreamResponse
from tests.helpers.gateways import TENANT_KEY, Gateway, backend, logged_private_gateway
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.stream_receipts import CHAT, DONE, receipt_verifies, stream_receipt
from tests.helpers.waiting import until

ORIGIN = "test.owngate/direct-relay"
EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i for i in range(20)]


def test_a_paced_stream_goes_out_by_the_body_writer_and_its_receipt_verifies(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def paced(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        for event in [*EVENTS, DONE]:  # one write per token, as a decoding server writes
            writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.005)  # pacing the backend, not waiting on the gateway
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    written: list[bytes] = []
    write = BodyWriter.write

    def counted(self: BodyWriter, data: bytes) -> bool:
        written.append(data)
        return write(self, data)

    monkeypatch.setattr(BodyWriter, "write", counted)
    raw = start_raw(paced)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    seen = b"".join([*EVENTS, DONE])
    assert response.content.startswith(seen)
    # The first chunk goes by `send` (it starts the response); the rest by the writer.
    assert seen.endswith(b"".join(written))
    assert written  # (how many: as the paced reads came, merged on a busy machine)
    receipt_verifies(tmp_path, response, stream_receipt(response), seen)


# 1 KiB events, 64 to a chunk of the backend's framing
_BIG_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"%b"}}]}\n\n' % (b"x" * 978)
_BIG_CHUNK = b"%x\r\n%b\r\n" % (64 * len(_BIG_EVENT), _BIG_EVENT * 64)
_FLOOD_BYTES = 64 << 20  # what the backend would write, were it never held back


@dataclass
class _Flood:
    written: int = 0  # bytes the backend's socket took
    blocked: bool = False  # waiting for the gateway to read on
    finished: bool = False  # all of `_FLOOD_BYTES` went


def test_a_client_that_reads_nothing_stops_the_gateway_reading_the_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fast backend streams 64 MB to a client that reads none of it: the gateway must
    hold the backend back (stop reading its connection), not buffer the stream."""
    flood = _Flood()

    async def fast(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        while flood.written < _FLOOD_BYTES:
            writer.write(_BIG_CHUNK)
            flood.written += len(_BIG_CHUNK)
            flood.blocked = True
            await writer.drain()
            flood.blocked = False
        flood.finished = True
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return False

    draining = threading.Event()  # the relay waits for the client's buffers to drain
    writers: list[BodyWriter] = []
    responses: list[UpstreamResponse] = []
    drain, pump = BodyWriter.drain, UpstreamResponse.pump

    async def noted_drain(self: BodyWriter) -> None:
        writers.append(self)
        draining.set()
        await drain(self)

    def noted_pump(self: UpstreamResponse, *args: object) -> object:
        responses.append(self)
        return pump(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(BodyWriter, "drain", noted_drain)
    monkeypatch.setattr(UpstreamResponse, "pump", noted_pump)
    raw = start_raw(fast)
    gateway = start_gateway([backend("gpu", raw.url, "m")])
    body = json.dumps(CHAT).encode()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    try:
        client.connect(("127.0.0.1", gateway.server.port))
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n"
            b"authorization: Bearer %b\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (TENANT_KEY.encode(), len(body), body)
        )

        def held_back() -> bool:  # ... or not: the backend got all of it out
            if flood.finished:
                return True
            if not (draining.is_set() and flood.blocked and responses):
                return False
            transport = responses[0]._conn.transport
            return transport is not None and not transport.is_reading()

        until(held_back, "the backend held back, or done", timeout=60, detail=lambda: flood)
        assert not flood.finished, "the gateway read the whole stream for a client reading none"
        # Socket buffers on both sides hold a few MB at most; the gateway itself, the
        # bytes in its client connection's write buffer: about its high-water mark.
        assert flood.written < _FLOOD_BYTES // 2
        cycle = writers[0]._cycle()
        assert cycle is not None
        coalescer: Any = cycle.transport
        assert coalescer._transport.get_write_buffer_size() < 1 << 20
    finally:
        client.close()
