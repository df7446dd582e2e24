"""A client that resets its connection while the backend's `[DONE]` is on its way: the
private relay's sink writes each read to the client's transport from the backend
connection's read callback (gateway/api/stream_relay.py), which may run before the loop
has read the client's reset in the same turn. The write then fails (uvloop closes the
transport, tells the protocol a turn later): nothing of it reached the client, so its
`[DONE]` is no end the client read (its record says 499, not 200) and the response
commitment does not cover it."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.upstream.response import UpstreamResponse
from tests.helpers.audit_rig import logged, request_log, settled
from tests.helpers.gateways import Gateway, backend
from tests.helpers.log_truth import CHAT, DONE
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.waiting import until

EVENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def test_a_done_written_to_a_connection_the_client_reset_is_not_recorded_as_read(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release, done_written, checked = threading.Event(), threading.Event(), threading.Event()

    async def answer(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n") + _chunk(EVENT))
        await writer.drain()
        await asyncio.to_thread(release.wait, 30)
        writer.write(_chunk(DONE) + b"0\r\n\r\n")
        await writer.drain()  # on loopback: in the gateway's socket now
        done_written.set()
        await asyncio.to_thread(checked.wait, 30)  # open till the end: no part of the answer
        return False

    loops: list[asyncio.AbstractEventLoop] = []
    pump = UpstreamResponse.pump

    async def pumping(self: UpstreamResponse, *args: Any) -> None:
        loops.append(asyncio.get_running_loop())
        await pump(self, *args)

    monkeypatch.setattr(UpstreamResponse, "pump", pumping)
    raw = start_raw(answer)
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    body = json.dumps(CHAT).encode()
    client = socket.create_connection((gateway.server.host, gateway.server.port), timeout=30)
    client.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: %b\r\ncontent-length: %d\r\n\r\n%b"
        % (gateway.headers["authorization"].encode(), len(body), body)
    )
    got = b""
    while EVENT not in got:  # the stream started: its relay pumps from the read callback
        piece = client.recv(65536)
        assert piece, got
        got += piece
    until(lambda: bool(loops), "the relay pumping")
    request_id = next(
        line.split(b":", 1)[1].strip().decode()
        for line in got.split(b"\r\n")
        if line.lower().startswith(b"x-request-id:")
    )
    # Hold the gateway's loop while the backend's `[DONE]` arrives and then the client's
    # reset: both wait when it runs again, the backend's read first.
    held, unhold = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        unhold.wait(30)

    loops[0].call_soon_threadsafe(hold)
    try:
        assert held.wait(30)
        release.set()
        assert done_written.wait(30)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset: the gateway's next write to it fails
    finally:
        unhold.set()
    logdir = tmp_path / "log"
    try:
        settled(logdir, vkey, request_id)
        records = request_log(logdir, vkey, request_id)
    finally:
        checked.set()
    [completion] = [r for r in records if r["type"] == "completion"]
    # The client never got the `[DONE]`: it left before its stream's end.
    assert completion["status"] == 499, completion
