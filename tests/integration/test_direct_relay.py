"""A stream relayed through the public listener goes out by its `BodyWriter`
(gateway/body_writer.py), chunk by chunk from the backend connection's callbacks, and
the log still commits to exactly the bytes the client got."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest

from gateway.api import stream_relay
from gateway.api.exchange import Exchange, send_relayed
from gateway.asgi import Send
from gateway.body_writer import BodyWriter
from gateway.coalescing import HeadCoalescer
from gateway.upstream.connection import _Connection
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
    first_sent = threading.Event()  # the first chunk went by `send`

    async def paced(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        for n, event in enumerate([*EVENTS, DONE]):  # one write per token, as a server does
            writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()
            if n == 0:  # the rest only once the first is out: a busy machine cannot merge them
                assert await asyncio.to_thread(first_sent.wait, 30)
            await asyncio.sleep(0.005)  # pacing the backend, not waiting on the gateway
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    by_send: list[bytes] = []  # what went by the ASGI `send`, not the relay's sink

    async def counted(send: Send, exchange: Exchange, data: bytes) -> None:
        by_send.append(data)
        await send_relayed(send, exchange, data)
        first_sent.set()

    monkeypatch.setattr(stream_relay, "send_relayed", counted)
    raw = start_raw(paced)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    seen = b"".join([*EVENTS, DONE])
    assert response.content.startswith(seen)
    # The first chunk goes by `send` (it starts the response); the rest from the sink,
    # written to the client's connection in the backend connection's read callback.
    assert len(by_send) == 1, by_send
    assert seen.startswith(by_send[0]) and len(by_send[0]) < len(seen)
    receipt_verifies(tmp_path, response, stream_receipt(response), seen)


# The Python calls (functions, not C methods) one read of a paced stream costs the
# logged gateway, from the backend connection's read callback to the client's write and
# the record's hash, all under that one callback: `data_received`, `_push`, the relay's
# sink, the framing check, the stream watch and its event reader (what the client's SDK
# reads, for the record). Each was once more: a callback scheduled per read (`_to_sink`,
# with its handle and buffer), `BodyWriter.write` (its checks the sink's own, made
# before the watch reads), the buffer's `_take` and `_resume`,
# `Attempt.answered`, `relayed`, `write_paused`, `HeadCoalescer.write` passing every
# chunk on, and `Trail.relayed` keeping a tail that a private stream's record never reads
# (its usage is the one the event reader read): the sink hashes the chunk itself; and
# `on_body`, now the body list's own `append` (a C method).
READ_CALLS = 6


class _ReadCalls:
    """A profile hook (`threading.setprofile`) that counts, per call of a read's two
    callbacks, the Python calls made under it."""

    def __init__(self) -> None:
        # (`_to_sink`: the callback each read once scheduled, if the tree has one)
        scheduled = getattr(UpstreamResponse, "_to_sink", None)
        self.roots = {_Connection.data_received.__code__}
        if scheduled is not None:
            self.roots.add(scheduled.__code__)
        self.groups: list[list[str]] = []

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            code = frame.f_code
            if code in self.roots:
                self.groups.append([code.co_qualname])
                return
            name, caller = code.co_qualname, frame.f_back
        elif event == "c_call":  # a C function or method: `arg`, called from `frame`
            name, caller = f"{getattr(arg, '__qualname__', arg)}()", frame
        else:
            return
        while caller is not None:
            if caller.f_code in self.roots:
                self.groups[-1].append(name)
                return
            caller = caller.f_back

    def usual(self, root: str) -> list[str]:
        """The calls of the most common invocation of `root` (a paced read's)."""
        shapes = Counter(tuple(group) for group in self.groups if group[0] == root)
        return list(shapes.most_common(1)[0][0]) if shapes else []


def test_a_paced_read_costs_the_relay_a_fixed_few_python_calls(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    got = [threading.Event() for _ in EVENTS]

    async def lockstep(writer: asyncio.StreamWriter, _: Post) -> bool:
        """One event per read: the next is written once the client has the last."""
        loop = asyncio.get_running_loop()
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        for event, arrived in zip(EVENTS, got, strict=True):
            writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()
            assert await loop.run_in_executor(None, arrived.wait, 30)
        writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(DONE), DONE))
        await writer.drain()
        return True

    raw = start_raw(lockstep)
    calls = _ReadCalls()
    threading.setprofile(calls)  # the gateway's server thread, started next
    try:
        gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    finally:
        threading.setprofile(None)
    seen = b""
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/chat/completions",
        json=CHAT,
        headers=gateway.headers,
        timeout=30,
    ) as response:
        assert response.status_code == 200
        for piece in response.iter_raw():
            seen += piece
            for event, arrived in zip(EVENTS, got, strict=True):
                if event in seen:
                    arrived.set()
    assert seen.startswith(b"".join([*EVENTS, DONE]))
    read = calls.usual("_Connection.data_received") + calls.usual("UpstreamResponse._to_sink")
    python = [name for name in read if not name.endswith("()")]
    assert len(python) <= READ_CALLS, f"{len(python)} calls per read: {read}"
    # the whole relay of a read runs in its read callback, the hash too; the client's
    # write with it (a C call: the transport's `write`), not in a frame of its own
    assert not calls.usual("UpstreamResponse._to_sink"), read
    assert "BodyWriter.write" not in read, read
    # The searches of the read: that it is one `data: {` line and its blank line (two
    # one-byte `find`s, LF and CR: `sse_framing.one_data_line`), which rules out an
    # `owngate-` comment (the comment filter is not fed it), a `[DONE]` value and a field
    # that dispatches an event without data; the stream watch's for `"usage"` (`[DONE]` is
    # not looked for in such a read: its value starts `{`); the
    # event reader's: whether the client's SDK raises at a line that is not UTF-8 (a byte
    # that is not ASCII: one `isascii`). A paced token of the last parsed chunk's shape is
    # then not parsed: its head and foot are compared (`startswith`, `endswith`) and its
    # content string matched once as plain characters (one compiled `fullmatch`); no
    # search for what makes an event worth parsing (gateway/api/sse_events.py, `_learn`).
    searches = [name for name in read if name.startswith("bytes.")]
    assert searches == [
        *["bytes.find()"] * 3,
        "bytes.isascii()",
        "bytes.startswith()",
        "bytes.endswith()",
    ], read
    assert read.count("loads()") == 0, read  # the first token was parsed, not this one
    assert [name for name in read if name.startswith("Pattern.")] == ["Pattern.fullmatch()"]
    assert "CommentFilter.feed" not in read, read
    assert "Trail.relayed" not in read, read  # (the hash is the trail's only per-read work)
    assert read.count("HASH.update()") == 1, read


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
        # the connection's own transport: the coalescer gave it back (`BodyWriter.ready`)
        transport: Any = cycle.transport
        assert not isinstance(transport, HeadCoalescer)
        assert transport.get_write_buffer_size() < 1 << 20
    finally:
        client.close()
