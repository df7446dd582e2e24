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
