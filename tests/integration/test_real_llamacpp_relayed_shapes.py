"""What a real llama-server answers, in its content types and chunk framing, passes the
gateway's checks of a backend's answer (gateway/api/answer_reads.py `relayed_type`, the
chunk bound of gateway/upstream/connection.py): embeddings (float and base64) and both
streams, through the gateway; its stream chunks are never below `CHUNK_BYTES`."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.upstream.connection import CHUNK_BYTES
from tests.helpers.gateways import Gateway, backend
from tests.helpers.prerequisites import real_backend
from tests.helpers.real_backend.server import LlamaServer, running_llama_server

pytestmark = pytest.mark.real_backend

CHAT = {"model": "tiny", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}
PROMPT = {"model": "tiny", "max_tokens": 40, "prompt": "Once"}


@pytest.fixture
def embedding_llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """The tiny model served with `/v1/embeddings` on (mean pooling: OpenAI's shape)."""
    with running_llama_server(
        real_backend(),
        alias="tiny",
        slots=2,
        ctx_size=2048,
        extra_args=["--embeddings", "--pooling", "mean"],
        log_dir=tmp_path_factory.mktemp("llama-server-embeddings"),
    ) as server:
        yield server


def raw_answer(server: LlamaServer, path: str, body: dict[str, object]) -> tuple[bytes, bytes]:
    """The head and the (chunk-framed) body of the server's answer, as it sent them."""
    url = urlsplit(server.base_url)
    data = json.dumps(body).encode()
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, rest = answer.partition(b"\r\n\r\n")
    return head.lower(), rest


def chunk_sizes(framed: bytes) -> list[int]:
    """The sizes of the chunks of a chunked body, the last (empty) one left out."""
    sizes: list[int] = []
    for _ in range(100_000):
        line, _, framed = framed.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            return sizes
        sizes.append(size)
        framed = framed[size + 2 :]
    raise AssertionError("no last chunk")


def test_the_real_servers_answers_pass_the_gateways_checks(
    embedding_llamacpp: LlamaServer, start_gateway: Callable[..., Gateway]
) -> None:
    server = embedding_llamacpp
    head, _ = raw_answer(server, "/v1/embeddings", {"model": "tiny", "input": "hello"})
    assert b"content-type: application/json; charset=utf-8\r\n" in head  # a charset given
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", PROMPT)):
        head, framed = raw_answer(server, path, {**body, "stream": True})
        assert b"transfer-encoding: chunked" in head
        assert min(chunk_sizes(framed)) >= CHUNK_BYTES  # `data: [DONE]` the least: 14 bytes

    gateway = start_gateway([backend("cpu-llama", server.base_url, "tiny", kind="llamacpp")])

    def post(path: str, body: dict[str, object]) -> httpx.Response:
        url = f"{gateway.url}/v1/{path}"
        return httpx.post(url, json=body, headers=gateway.headers, timeout=60)

    for encoding in ("float", "base64"):
        body = {"model": "tiny", "input": ["hello", "world"], "encoding_format": encoding}
        answer = post("embeddings", body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json; charset=utf-8"
        assert len(answer.json()["data"]) == 2
    for path, body in (("chat/completions", CHAT), ("completions", PROMPT)):
        answer = post(path, {**body, "stream": True})
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.text.rstrip().endswith("data: [DONE]")
