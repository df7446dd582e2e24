"""Two tenants through one private backend's pool, the backend out of step with its
requests: no tenant ever reads bytes a backend wrote for another tenant's request.

The backend answers each request with the content of the request's own message, so an
answer tells whose request it was written for. On `acme`'s first request it also
misbehaves: bytes past the length it announced (a second response, or part of one),
another response written later while the connection waits in the pool, a
`connection: close` or an HTTP/1.0 answer after which it keeps the connection and
answers again, interim responses before its answer, framing it contradicts. Then `other`
asks: its answer is its own, whatever the pool had been handed (gateway/upstream/
connection.py drops a connection that is out of step, and one that said it closes).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, Gateway, backend
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_body

TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]
ACME, OTHER = "acme-secret-7f3a", "other-question-19c2"


def _response(content: str, version: bytes = b"HTTP/1.1", extra: bytes = b"") -> bytes:
    body = completion_body(content)
    head = b"%s 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
    return head % (version, len(body), extra) + body


def _asked(post: Post) -> str:
    content: str = json.loads(post.body)["messages"][0]["content"]
    return content


# What the backend writes for acme's first request, given its honest answer: the bytes
# written at once, and those written once acme's client has its answer (None: nothing).
Misbehaviour = Callable[[str], tuple[bytes, bytes | None]]
_FORGED = _response(f"for {ACME}")  # what must never reach `other`
_PARTIAL = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n"
_PARTIAL_BODY = _PARTIAL + b'{"for": "' + ACME.encode()
MISBEHAVIOURS: dict[str, Misbehaviour] = {
    # a length shorter than the body: the rest reads as a second response
    "short-length": lambda asked: (_response(asked) + _FORGED, None),
    # a second response after the first, while the connection waits in the pool
    "late-second-response": lambda asked: (_response(asked), _FORGED),
    # the head and part of a body nobody asked for: the next answer would be its rest
    "late-partial-response": lambda asked: (_response(asked), _PARTIAL_BODY),
    # part of a second response in the same write as the first
    "partial-in-the-same-write": lambda asked: (_response(asked) + _PARTIAL[:20], None),
    # says it closes, keeps the connection and answers again
    "close-not-honoured": lambda asked: (_response(asked, extra=b"connection: close\r\n"), _FORGED),
    # HTTP/1.0 without keep-alive: the connection ends with the answer
    "http-1.0": lambda asked: (_response(asked, b"HTTP/1.0"), _FORGED),
    # a hundred interim responses, then the answer: the connection is still in step
    "interim-responses": lambda asked: (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        + b"HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\n" * 100
        + _response(asked),
        None,
    ),
}


# Still in step after its answer: the connection may serve the next request.
IN_STEP = {"interim-responses"}


def _backend(
    misbehave: Misbehaviour, answered: threading.Event, written: threading.Event
) -> Answer:
    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        asked = _asked(post)
        if asked != ACME or written.is_set():
            writer.write(_response(asked))
            await writer.drain()
            return True
        now, later = misbehave(asked)
        writer.write(now)
        await writer.drain()
        if later is not None:
            await asyncio.to_thread(answered.wait, 10)
            writer.write(later)
            await writer.drain()
        written.set()
        return True  # whatever it said, it keeps the connection and answers on it

    return answer


def _ask(gateway: Gateway, key: str, content: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": content}]},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


@pytest.mark.parametrize("misbehaviour", list(MISBEHAVIOURS))
def test_another_tenant_never_reads_what_a_backend_wrote_for_acme(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    misbehaviour: str,
) -> None:
    answered, written = threading.Event(), threading.Event()
    raw = start_raw(_backend(MISBEHAVIOURS[misbehaviour], answered, written))
    gateway = start_gateway(
        [backend("gpu", raw.url, "m")],
        limits={"max_connections_per_backend": 1, "read_timeout_s": 5.0},
        tenants=TWO_TENANTS,
    )
    first = _ask(gateway, TENANT_KEY, ACME)
    answered.set()
    assert first.status_code == 200, first.text
    assert first.json()["choices"][0]["message"]["content"] == ACME
    # All of it written (on loopback, in the gateway's socket) before `other` asks: an
    # answer still in flight as a request goes out on a reused connection cannot be told
    # from that request's (HTTP/1.1 names no request in its answers).
    assert written.wait(10)
    for _ in range(2):
        second = _ask(gateway, OTHER_KEY, OTHER)
        assert ACME not in second.text
        assert second.status_code == 200, second.text
        assert second.json()["choices"][0]["message"]["content"] == OTHER
    acmes = {post.connection for post in raw.posts if _asked(post) == ACME}
    others = {post.connection for post in raw.posts if _asked(post) == OTHER}
    if misbehaviour not in IN_STEP:
        assert not acmes & others  # the connection acme's answer came on was dropped
