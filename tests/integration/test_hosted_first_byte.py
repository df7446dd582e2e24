"""A hosted provider's stream must begin within `limits.first_byte_timeout_s`, however
steadily it sends bytes that are no chunk of it (gateway/upstream/hosted.py).

LiteLLM's `timeout` (the first-byte timeout) bounds each read, and every byte starts it
over: a provider answering a stream request with header lines one at a time, interim
1xx responses, or SSE comments and no event held the attempt for as long as it kept
writing (and, with no `limits.stream_timeout_s`, the default, its client with it), where
a private backend's attempt fails over at the first-byte timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS, Gateway, hosted_backend
from tests.helpers.raw_backend import Answer, Post, RawBackend

pytestmark = LITELLM_WARNINGS

DRIP_S = 0.2  # between two writes: far inside the read timeout
WRITES = 150  # 30 s of writes at most, if nobody stops them
FIRST_BYTE_S = 1.0

DRIPS = {
    "header-lines": (b"HTTP/1.1 200 OK\r\n", b"x-wait: 1\r\n"),
    "interim-responses": (b"", b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"),
    "comments-only": (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
        b": still here\n\n",
    ),
}


def _dripping(first: bytes, piece: bytes, written: list[int]) -> Answer:
    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(first)
        for _ in range(WRITES):
            writer.write(piece)
            await writer.drain()
            written[0] += 1
            await asyncio.sleep(DRIP_S)  # the fault itself: bytes that never start a stream
        return False

    return answer


@pytest.mark.parametrize("drip", list(DRIPS))
def test_a_stream_that_never_begins_fails_at_the_first_byte_timeout(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    drip: str,
) -> None:
    written = [0]
    raw = start_raw(_dripping(*DRIPS[drip], written))
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", raw.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"first_byte_timeout_s": FIRST_BYTE_S, "read_timeout_s": 30.0},
    )
    ask = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    started = time.monotonic()
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=90
    )
    # LiteLLM is loaded before the attempt's clock starts (`prepare`): not in the wait.
    assert response.status_code in (503, 504), response.text
    assert "error" in response.json()
    assert raw.finished.wait(30)  # the gateway hung up: the provider stopped writing
    assert written[0] < WRITES // 2, (written[0], time.monotonic() - started)


@pytest.mark.parametrize("drip", ["header-lines", "interim-responses"])
def test_a_whole_answer_whose_head_never_ends_fails_at_the_first_byte_timeout(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    drip: str,
) -> None:
    # A non-stream answer's head dripping in was bounded only by the whole answer's
    # `limits.response_timeout_s` (600 s), not by the first-byte timeout as a private
    # backend's head is: the attempt never failed over meanwhile.
    written = [0]
    raw = start_raw(_dripping(*DRIPS[drip], written))
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", raw.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"first_byte_timeout_s": FIRST_BYTE_S, "read_timeout_s": 30.0},
    )
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    started = time.monotonic()
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=90
    )
    assert response.status_code in (503, 504), response.text
    assert "error" in response.json()
    assert raw.finished.wait(30)
    assert written[0] < WRITES // 2, (written[0], time.monotonic() - started)


def test_a_whole_answer_whose_body_takes_longer_than_the_first_byte_timeout_is_served(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # The head within the first-byte timeout; its body then has the whole answer's time.
    body = (
        b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":"slow but whole"},'
        b'"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,'
        b'"total_tokens":2}}'
    )
    pieces = [body[i : i + 16] for i in range(0, len(body), 16)]

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body)
        )
        for piece in pieces:  # about 2.5 s in all: past the first-byte timeout
            await writer.drain()
            await asyncio.sleep(2.5 * FIRST_BYTE_S / len(pieces))
            writer.write(piece)
        await writer.drain()
        return False

    raw = start_raw(answer)
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", raw.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"first_byte_timeout_s": FIRST_BYTE_S, "read_timeout_s": 30.0},
    )
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=90
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "slow but whole"
