"""A stream relayed through the public listener goes out by its `BodyWriter`
(gateway/body_writer.py), chunk by chunk from the backend connection's callbacks, and
the log still commits to exactly the bytes the client got."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.body_writer import BodyWriter
from tests.helpers.gateways import Gateway, logged_private_gateway
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.integration.test_sse_comments import CHAT, DONE, _receipt, _verifies

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
    assert len(written) >= 10  # paced: many reads, each relayed on its own
    _verifies(tmp_path, response, _receipt(response), seen)
