"""A private backend whose streams are paced like a decoding server's until the test
releases them, so the connections they hold are really held (tests of a tenant's share
of a backend's pool)."""

from __future__ import annotations

import asyncio
import json
import threading

from tests.helpers.raw_backend import Answer, Post, sse_head

__all__ = ["paced"]

ANSWER = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)


def _token(n: int) -> bytes:
    chunk = {
        "id": "s",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": f"t{n} "}}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def paced(released: threading.Event) -> Answer:
    """A stream paced like a decoding server (a token every 20 ms) until `released` is
    set (3,000 tokens, 60 s, at most); a whole answer at once for a request without
    `stream`."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        if not json.loads(post.body).get("stream"):
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            )
            writer.write(head % len(ANSWER) + ANSWER)
            await writer.drain()
            return False
        writer.write(sse_head())
        for n in range(3000):
            if released.is_set():
                break
            writer.write(_token(n))
            await writer.drain()
            await asyncio.sleep(0.02)
        return False

    return answer
