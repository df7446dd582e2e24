"""A backend's refusal of one request (401, 403, 404, 501) fails that attempt over, but is
no verdict on the backend: the endpoint asked for, chosen by the client, may be one this
backend lacks (text-generation-inference has no `/v1/embeddings`: 404; llama.cpp without
`--embeddings`: 501). Counted as failures, three such requests from one tenant opened the
backend's breaker for every tenant, whose requests then went to the next backend, to a
hosted provider (`when_private_unavailable`: a failed backend is unavailable), or nowhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import orjson
import pytest

from tests.helpers.gateways import Gateway, backend
from tests.helpers.raw_backend import Answer, Post, RawBackend

ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)


@pytest.mark.parametrize("status", [401, 403, 404, 501])
def test_a_request_the_backend_refuses_does_not_take_it_out_for_everyone(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    status: int,
) -> None:
    async def chat_only(writer: asyncio.StreamWriter, post: Post) -> bool:
        if b'"input"' in post.body:  # an embeddings request: an endpoint it lacks
            body = b'{"error": {"message": "Not Found"}}'
            head = b"HTTP/1.1 %d No\r\ncontent-type: application/json\r\n" % status
        else:
            body, head = ANSWER, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return True

    raw = start_raw(chat_only)
    gateway = start_gateway([backend("gpu", raw.url, "m")])
    with httpx.Client(base_url=gateway.url, headers=gateway.headers, timeout=30) as client:
        statuses = set()
        for _ in range(4):  # past the breaker's failure_threshold (3)
            refused = client.post("/v1/embeddings", json={"model": "m", "input": "x"})
            statuses.add(refused.status_code)
            assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
        chat = client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert len(statuses) == 1 and 503 not in statuses  # the same refusal, never "no backend up"
    assert (chat.status_code, chat.content) == (200, ANSWER)  # not 503: breaker closed
    assert len(raw.posts) == 5  # each embeddings request reached it too
