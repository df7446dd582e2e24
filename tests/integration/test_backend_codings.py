"""A private backend's answer reaches the client decodable, over real sockets.

Every request the upstream client sends asks for no content coding
(`accept-encoding: identity`; without the field RFC 9110 reads any coding as
acceptable), whatever the gateway's client asked for. An answer in another content
coding, or in a transfer coding other than chunked, is refused: the gateway relays
bytes as they came and never decompresses, so relayed it would reach the client
undecodable, labelled JSON or SSE, with no usage in the record. The client gets 502
`upstream_error` in the OpenAI format (another backend serves if one can), the
sidecar the same.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.attest import AttestSettings, AttestThread
from gateway.config.schema import ListenSettings
from gateway.provenance import write_signing_key
from gateway.upstream.http import HttpPool, UpstreamError
from tests.helpers.gateways import Gateway, Sim, backend, logged_private_gateway
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer
from tests.helpers.raw_socket import exchange, parse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)
STREAM = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"hello"}}]}\n\ndata: [DONE]\n\n'
)
ORIGIN = "test.owngate/codings"


def coded(content_type: bytes, body: bytes, field: bytes = b"content-encoding: gzip") -> Answer:
    """A 200 answer with `field`, its body gzip-compressed (chunked when `field` is a
    transfer-encoding, else with its content-length)."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        data = gzip.compress(body)
        head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\n%s\r\n" % (content_type, field)
        if field.lower().startswith(b"transfer-encoding"):
            writer.write(head + b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        else:
            writer.write(head + b"content-length: %d\r\n\r\n%s" % (len(data), data))
        await writer.drain()
        return False

    return answer


def plain(field: bytes) -> Answer:
    """A 200 JSON answer in no coding, whatever `field` says (identity, chunked)."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%s\r\n" % field
        if field.lower().startswith(b"transfer-encoding"):
            writer.write(head + b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(ANSWER), ANSWER))
        else:
            writer.write(head + b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
        await writer.drain()
        return False

    return answer


async def _ask(url: str) -> bytes:
    """One request through a pool of the upstream client; the answer's body."""
    pool, prefix = HttpPool.for_url(
        url, connect_timeout=5.0, first_byte_timeout=30.0, read_timeout=30.0, max_connections=2
    )
    try:
        response = await pool.request(b"POST", prefix + b"/v1/chat/completions", [], b"{}")
        return await response.read()
    finally:
        assert pool.open_connections <= 1
        await pool.close()


@pytest.mark.parametrize(
    "field",
    [
        b"content-encoding: gzip",
        b"Content-Encoding: GZIP",
        b"content-encoding: identity, gzip",
        b"content-encoding: br",
        b"transfer-encoding: gzip, chunked",
    ],
)
def test_the_upstream_client_refuses_an_answer_in_a_coding(
    start_raw: Callable[[Answer], RawBackend], field: bytes
) -> None:
    raw = start_raw(coded(b"application/json", ANSWER, field))
    with pytest.raises(UpstreamError) as caught:
        asyncio.run(_ask(raw.url))
    assert caught.value.kind == "encoding"
    [post] = raw.posts
    assert post.header_values(b"accept-encoding") == [b"identity"]


@pytest.mark.parametrize(
    "field",
    [b"content-encoding: identity", b"Content-Encoding: Identity", b"transfer-encoding: chunked"],
)
def test_the_upstream_client_takes_an_answer_in_no_coding(
    start_raw: Callable[[Answer], RawBackend], field: bytes
) -> None:
    raw = start_raw(plain(field))
    assert asyncio.run(_ask(raw.url)) == ANSWER


def test_the_clients_accept_encoding_is_not_forwarded(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    raw = start_raw(json_answer(ANSWER))
    gateway = start_gateway([backend("gpu", raw.url, "m")])
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=CHAT,
        headers={**gateway.headers, "accept-encoding": "gzip, br, zstd"},
        timeout=60,
    )
    assert response.status_code == 200 and response.content == ANSWER
    [post] = raw.posts
    assert post.header_values(b"accept-encoding") == [b"identity"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_gzip_answer_is_a_502_in_the_openai_format_and_recorded_so(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    stream: bool,
) -> None:
    content_type, body = (b"text/event-stream", STREAM) if stream else (b"application/json", ANSWER)
    raw = start_raw(coded(content_type, body))
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, "stream": stream},
        headers={**gateway.headers, "accept-encoding": "gzip"},
        timeout=60,
    )
    assert response.status_code == 502, response.content[:200]
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "upstream_error" and "coding" in error["message"]
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 502
    assert all(post.header_values(b"accept-encoding") == [b"identity"] for post in raw.posts)


def test_another_backend_serves_when_one_answers_compressed(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
) -> None:
    raw = start_raw(coded(b"application/json", ANSWER))
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway(
        [backend("gzip", raw.url, "m"), backend("good", sim.url, "m")],
        routing={"pools": {"m": {"strategy": "round_robin"}}},
    )
    for _ in range(2):  # one of them tries the compressing backend first
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=60
        )
        assert response.status_code == 200
        assert response.json()["object"] == "chat.completion"
    assert raw.posts


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[tuple[RawBackend, AttestThread]]:
    raw = RawBackend(coded(b"application/json", ANSWER)).start()
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    settings = AttestSettings(backend=raw.url, key_file=key, log_dir=tmp_path / "sidecar-log")
    thread = AttestThread(settings, listen=ListenSettings()).start()
    yield raw, thread
    thread.stop()
    raw.stop()


def test_the_sidecar_asks_for_identity_and_refuses_a_compressed_answer(
    sidecar: tuple[RawBackend, AttestThread],
) -> None:
    raw, thread = sidecar
    body = orjson.dumps(CHAT)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"accept-encoding: gzip\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
        % (len(body), body)
    )
    status, headers, answer = parse(exchange(thread, request))
    assert status == 502, answer[:200]
    assert "x-owngate-attest" not in headers  # nothing countersigned
    assert orjson.loads(answer)["error"]["code"] == "upstream_error"
    [post] = raw.posts
    assert post.header_values(b"accept-encoding") == [b"identity"]
