"""What the log commits to when a client leaves while a stream's chunk waits to be sent
through ASGI `send` (a hosted stream's path): exactly the bytes handed to the client's
connection, never a chunk still waiting for the client to take more.

The bytes handed over are read where the gateway writes them (`HeadCoalescer.write`, the
transport of the request's cycle); the send is caught waiting (uvicorn's
`FlowControl.drain` with writing paused) before the client closes its socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from gateway.coalescing import HeadCoalescer
from gateway.provenance import commit
from tests.helpers.gateways import LITELLM_WARNINGS, Gateway
from tests.helpers.log_truth import hosted_gateway, salt_of
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

pytestmark = LITELLM_WARNINGS

_WORDS = "word " * 4000  # a 20 KB delta: the client's buffers fill in a few events


def _provider_event(n: int) -> bytes:
    chunk = {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": f"{n} {_WORDS}"}}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _body_of(written: bytes) -> tuple[str, bytes]:
    """The request id and the chunked body's bytes in a response as written (cut off)."""
    head, _, rest = written.partition(b"\r\n\r\n")
    request_id = head.split(b"x-request-id: ")[1].split(b"\r\n")[0].decode()
    body = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        assert size and len(rest) >= size + 2, "the writes end with a whole chunk"
        body, rest = body + rest[:size], rest[size + 2 :]
    return request_id, body


def test_a_chunk_waiting_for_a_client_that_left_is_not_committed_to(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hosted stream outruns a client that stopped reading: the gateway's `send` of
    the next chunk waits for the client to drain; the client then leaves. That chunk
    never went out, so the 499 record commits to the chunks written before it."""
    written: dict[int, list[bytes]] = {}
    write = HeadCoalescer.write

    def recorded(self: HeadCoalescer, data: bytes) -> None:
        written.setdefault(id(self), []).append(data)
        write(self, data)

    waiting = threading.Event()
    drain = FlowControl.drain

    async def watched(self: FlowControl) -> None:
        if self.write_paused:
            waiting.set()
        await drain(self)

    monkeypatch.setattr(HeadCoalescer, "write", recorded)
    monkeypatch.setattr(FlowControl, "drain", watched)
    released = threading.Event()

    async def endless(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head())
        n = 0
        while not released.is_set():
            writer.write(_provider_event(n))
            await writer.drain()
            n += 1
        return False

    raw = start_raw(endless)
    gateway = hosted_gateway(start_gateway, tmp_path, f"{raw.url}/v1", "m")
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body = json.dumps(ask).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {gateway.key}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    try:
        with socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.settimeout(30)
            client.connect((gateway.server.host, gateway.server.port))
            client.sendall(head + body)
            got = b""
            while b"\r\n\r\n" not in got:
                got += client.recv(4096)
            assert waiting.wait(60), "the gateway's send never waited for the client"
        request_id = got.split(b"x-request-id: ")[1].split(b"\r\n")[0].decode()
        record = completion_record(tmp_path / "log", request_id)  # the stream is over
        (first, *_) = written.values()  # the stream's connection: the first one written
        written_id, sent = _body_of(b"".join(first))
    finally:
        released.set()
    assert written_id == request_id and record["status"] == 499
    receipt = httpx.get(
        f"{gateway.url}/v1/provenance/receipts/{request_id}", headers=gateway.headers, timeout=10
    ).content
    _, salt = salt_of(receipt)
    assert sent.startswith(b'data: {"id":"x"')
    assert record["response_commitment"] == commit("response", salt, sent)
