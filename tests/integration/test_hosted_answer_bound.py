"""What the gateway reads of a hosted provider's answer is bounded by
`limits.max_response_bytes` (gateway/upstream/hosted_bound.py).

LiteLLM and the OpenAI SDK read a whole answer into memory, and each line of a stream
whole, before the gateway sees any of it: a hostile or compromised provider answering
200 MB grew `owngate serve` by 950 MB, one endless SSE line of 100 MB by 610 MB, and the
size check came only after. Now the read stops at the byte past the bound, the provider's
connection is dropped and the attempt fails as the provider's (`protocol`). Asserted on
what the provider managed to write (the gateway reads no further than its bound plus
what the kernel buffers), not on timing.
"""

from __future__ import annotations

import asyncio
import gzip
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    hosted_backend,
)
from tests.helpers.hosted_flood import (
    ANSWER_HEAD,
    ANSWER_TAIL,
    LIMIT,
    LINE_HEAD,
    OFFERED,
    PIECE,
    TOO_LARGE,
    flood,
)
from tests.helpers.log_capture import rendered_logs
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_body, json_answer
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS


def hosted_gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, provider: RawBackend
) -> Gateway:
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    return start_gateway(
        [hosted_backend("hosted", provider.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"max_response_bytes": LIMIT},
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_provider_flood_is_read_no_further_than_the_bound(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    stream: bool,
) -> None:
    # A whole answer of 48 MiB, or a stream whose first line never ends.
    written = [0]
    if stream:
        answer = flood(b"text/event-stream", LINE_HEAD, b'"}}]}\n\n', written)
    else:
        answer = flood(b"application/json", ANSWER_HEAD, ANSWER_TAIL, written)
    provider = start_raw(answer)
    gateway = hosted_gateway(start_gateway, tmp_path, provider)
    body: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers=gateway.headers, timeout=120
    )
    assert provider.finished.wait(60)
    # the bound, plus what the sockets' buffers on both sides hold on loopback
    assert written[0] < LIMIT + 8 * 1024 * 1024, f"the gateway read {written[0]} bytes"
    # as for a private backend's answer past the bound: the gateway's limit, not the
    # provider's failure (a client can ask for a huge answer): 502, no breaker charged
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "upstream_error"
    assert TOO_LARGE in response.json()["error"]["message"]
    assert b"xxxx" not in response.content  # none of it reached the client
    metrics = httpx.get(f"{gateway.url}/metrics", headers=gateway.headers, timeout=10).text
    assert 'kind="too_large"' in metrics


def _stream_request_flooded(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    head: bytes,
    piece: bytes,
    last: bytes,
) -> httpx.Response:
    """A stream request to a provider answering `head` (status line and content type),
    then OFFERED bytes of `piece` chunk by chunk as fast as they are read, then `last`:
    the gateway's answer, once the provider is done, asserted to have read no further
    than the bound (plus what the sockets' buffers on both sides hold on loopback)."""
    written = [0]

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
        for _ in range(OFFERED // len(piece)):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            written[0] += len(piece)
        writer.write((b"%x\r\n%s\r\n" % (len(last), last) if last else b"") + b"0\r\n\r\n")
        await writer.drain()
        return False

    provider = start_raw(answer)
    gateway = hosted_gateway(start_gateway, tmp_path, provider)
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers=gateway.headers,
        timeout=120,
    )
    assert provider.finished.wait(60)
    assert written[0] < LIMIT + 8 * 1024 * 1024, f"the gateway read {written[0]} bytes"
    return response


def test_a_stream_event_of_short_lines_is_read_no_further_than_the_bound(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # Each line short, no blank line until the end: the OpenAI SDK's decoder holds every
    # `data:` line of an event until the blank line that ends it, so bounding each line
    # alone read all 48 MiB (and held it).
    line = b"data: " + b"x" * (len(PIECE) - 7) + b"\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    response = _stream_request_flooded(start_raw, start_gateway, tmp_path, head, line, b"\n")
    assert response.status_code == 502, response.text
    assert TOO_LARGE in response.text


def test_an_error_answer_to_a_stream_is_bounded_whole(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # The OpenAI SDK reads an error answer to a stream request whole (`aread`) to raise
    # it: short events did not bound it, its total must.
    event = b"x" * (len(PIECE) - 2) + b"\n\n"
    head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
    response = _stream_request_flooded(start_raw, start_gateway, tmp_path, head, event, b"")
    assert response.status_code == 502, response.text
    assert TOO_LARGE in response.text


def test_an_answer_in_a_content_coding_is_refused_unread(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # 48 MiB of JSON gzipped to about 50 KB: decoded, it would be read whole past the
    # bound. Every hosted request asks for identity; an answer in another coding is
    # refused before any of it is decoded.
    bomb = gzip.compress(ANSWER_HEAD + b"x" * OFFERED + ANSWER_TAIL, compresslevel=9)
    assert len(bomb) < LIMIT

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        asked.extend(post.header_values(b"accept-encoding"))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(bomb), bomb)
        )
        await writer.drain()
        return False

    asked: list[bytes] = []
    provider = start_raw(answer)
    with rendered_logs() as logs:
        gateway = hosted_gateway(start_gateway, tmp_path, provider)
        response = httpx.post(
            gateway.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers=gateway.headers,
            timeout=120,
        )
        request_id = response.headers["x-request-id"]
        until(lambda: _access_line(logs, request_id) is not None, "the request's access line")
    assert asked == [b"identity"]
    assert response.status_code == 503, response.text
    # the client's 503 names no provider; the operator's access line says why
    assert "openai" not in response.text and "content coding" not in response.text
    line = _access_line(logs, request_id)
    assert line is not None
    assert "openai answered in a content coding" in line["unserved"], line


def test_an_answer_within_the_bound_is_served(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    content = "y" * (LIMIT - 4096)
    provider = start_raw(json_answer(completion_body(content)))
    gateway = hosted_gateway(start_gateway, tmp_path, provider)
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers=gateway.headers,
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == content


def test_a_provider_litellm_reaches_over_aiohttp_itself_is_not_sent_to(
    start_raw: Callable[[Answer], RawBackend],
) -> None:
    # LiteLLM sends `aiohttp_openai/` through aiohttp's ClientSession, not httpx: its 48 MiB
    # answer was read whole past the bound. The config refuses that route
    # (gateway/config/provider_routes.py); behind it, a bounded call refuses to send over
    # aiohttp except under httpx (whose reads are bounded). Built past the config's check.
    written = [0]
    provider = start_raw(flood(b"application/json", ANSWER_HEAD, ANSWER_TAIL, written))
    checked = BackendSettings.model_validate(hosted_backend("hosted", provider.url + "/v1", "m"))
    models = [m.model_copy(update={"provider_model": "aiohttp_openai/m"}) for m in checked.models]
    backend = checked.model_copy(update={"models": models})
    client = HostedClient(
        backend, environ={"HOSTED_KEY": "k"}, timeout_s=30.0, max_answer_bytes=LIMIT
    )

    async def call() -> None:
        try:
            doc = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            await client.send("chat", doc, "m")
        finally:
            await client.aclose()

    with pytest.raises(HostedError) as info:
        asyncio.run(call())
    assert info.value.kind == "protocol"  # this backend cannot serve: another may
    assert "over aiohttp directly" in info.value.message
    assert provider.connections == 0 and written[0] == 0  # nothing sent, nothing read


def _access_line(logs: io.StringIO, request_id: str) -> dict[str, Any] | None:
    """The access line of request `request_id` in the rendered JSON `logs`, if written."""
    for text in logs.getvalue().splitlines():
        if text.startswith("{"):
            line: dict[str, Any] = orjson.loads(text)
            if line.get("event") == "request" and line.get("request_id") == request_id:
                return line
    return None
