"""A private backend's stream relayed in pieces of at most 16 KiB (`PIECE`,
gateway/upstream/response.py), the event loop turning between them: what the relay does
with a read costs Python per line and per event (the comment filter, the event reader,
which parses every event as the client's SDK does), and a backend writing 4 MiB of blank
lines back to back held this gateway's event loop 0.25 s a read, a `/healthz` beside it
waiting 5.9 s (its scrape of the backend's `/metrics` timed out meanwhile). Counted, not
timed: the largest piece the relay's stream watch is fed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from gateway.api.sse import StreamWatch
from tests.helpers.comment_feeds import fed_sizes
from tests.helpers.gateways import Gateway, backend
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

PIECE = 16 * 1024
_BURST = b"\n" * (1024 * 1024)
_DONE = b"data: [DONE]\n\n"


def test_a_burst_of_blank_lines_is_relayed_in_pieces(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fed: list[int] = []
    feed = StreamWatch.feed

    def counted(self: StreamWatch, data: bytes, one_line: bool = False) -> bytes:
        fed.append(len(data))
        return feed(self, data, one_line)

    monkeypatch.setattr(StreamWatch, "feed", counted)

    async def burst(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        writer.write(b"%x\r\n%b\r\n" % (len(_BURST), _BURST))  # all of it at once
        writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(_DONE), _DONE))
        await writer.drain()
        return True

    raw = start_raw(burst)
    gateway = start_gateway([backend("gpu", raw.url, "m")])
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=chat, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.content.startswith(_BURST + _DONE)
    assert sum(fed) >= len(_BURST + _DONE)
    assert max(fed) <= PIECE, max(fed)  # was each read whole, up to 256 KiB


def test_a_whole_answer_s_comment_lines_are_walked_in_pieces(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A whole answer to a request that says `stream: true` (embeddings: not SSE either)
    loses its `owngate-` comment lines before it is checked: walked in one go, a 16 MiB
    answer of them held the event loop 3.4 s (CPU) before it was refused as no JSON; now
    16 KiB at a time, the loop turning between."""
    fed = fed_sizes(monkeypatch)
    body = b": owngate-x\n" * (1024 * 1024 // 12)

    async def whole(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
            % (len(body), body)
        )
        await writer.drain()
        return True

    raw = start_raw(whole)
    gateway = start_gateway([backend("gpu", raw.url, "m")])
    response = httpx.post(
        f"{gateway.url}/v1/embeddings",
        json={"model": "m", "input": "hi", "stream": True},
        headers=gateway.headers,
        timeout=60,
    )
    assert response.status_code == 502, response.text  # no JSON once they are gone
    assert sum(fed) == len(body)
    assert max(fed) <= PIECE, max(fed)  # was the whole answer
