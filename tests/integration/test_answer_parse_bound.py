"""A private backend's whole answer is parsed on the event loop only within a bound on its
arrays and objects (`usage_read.MAX_CONTAINERS`), over real sockets.

A hostile backend answering 15 MiB of `[],[],...` held the event loop 0.9 s and grew the
gateway by 510 MB to read its usage; ended by the close instead of framed, 6.8 s (the
completeness check parsed it with the collector running). Past the bound a framed answer
is relayed exactly with its usage unknown (the record states none), and one ended by the
close cannot be told whole: a failed attempt, as one cut short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.api.usage_read import MAX_CONTAINERS
from tests.helpers.gateways import Gateway, logged_private_gateway
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
USAGE = b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}'
ORIGIN = "test.owngate/parse-bound"


def answer_of(arrays: int) -> bytes:
    """A chat answer with its usage and `arrays` empty arrays besides."""
    return (
        b'{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"hello"}}],'
        + USAGE
        + b',"x":['
        + b"[]," * arrays
        + b"0]}"
    )


def post(gateway: Gateway) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=60
    )


def answering(body: bytes, *, framed: bool) -> Answer:
    async def answer(writer: asyncio.StreamWriter, _: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        framing = b"content-length: %d" % len(body) if framed else b"connection: close"
        head += framing + b"\r\n\r\n"
        writer.write(head + body)
        await writer.drain()
        return False

    return answer


@pytest.mark.parametrize(
    ("arrays", "read"), [(MAX_CONTAINERS - 8, True), (MAX_CONTAINERS + 1, False)]
)
def test_a_framed_answer_past_the_bound_is_relayed_with_its_usage_unknown(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    arrays: int,
    read: bool,
) -> None:
    body = answer_of(arrays)
    raw = start_raw(answering(body, framed=True))
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = post(gateway)
    assert (response.status_code, response.content) == (200, body)
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 200
    expected = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert record["usage"] == (expected if read else None)


@pytest.mark.parametrize(
    ("arrays", "whole"), [(MAX_CONTAINERS - 8, True), (MAX_CONTAINERS + 1, False)]
)
def test_an_answer_ended_by_the_close_past_the_bound_is_a_failed_attempt(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    arrays: int,
    whole: bool,
) -> None:
    body = answer_of(arrays)
    raw = start_raw(answering(body, framed=False))
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = post(gateway)
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    if whole:
        assert (response.status_code, response.content) == (200, body)
        assert record["status"] == 200
    else:
        assert response.status_code == 503  # its only backend failed: none left to try
        assert response.json()["error"]["code"] == "backend_unavailable"
        assert record["status"] == 503 and record["response_commitment"] is None
