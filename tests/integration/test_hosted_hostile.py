"""A hosted provider is held to what the gateway decides: where a prompt goes (its
redirect is never followed) and how long a stream may run (`limits.stream_timeout_s`).

Where a prompt may go is the policy's to say (a backend's `base_url`, its region and
retention terms), not the provider's. LiteLLM's HTTP clients and the OpenAI SDK's follow
redirects by default: a provider (or whoever answers at its URL) that answered 307 had
the gateway send the prompt on to any host it named, an internal one included, and relay
that host's answer to the client as the provider's. Now a 3xx is a failed call (the next
backend serves, else 503), and the target never hears of it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    TENANT_KEY,
    Gateway,
    hosted_backend,
)
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer, sse_head
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)
PROMPT = "the secret prompt"
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
    "chat-stream": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": PROMPT}], "stream": True},
    ),
    "completions": ("/v1/completions", {"prompt": PROMPT}),
}
PROVIDERS: dict[str, dict[str, Any]] = {
    "openai": {},
    "anthropic": {
        "provider": "anthropic",
        "models": [{"name": "m", "provider_model": "anthropic/claude-mock-1"}],
    },
    "azure": {
        "provider": "azure",
        "models": [{"name": "m", "provider_model": "azure/gpt-eu"}],
        "unsafe_unchecked_azure_host": True,  # the redirecting mock is on loopback
    },
}


@pytest.mark.parametrize("status", [307, 302])
@pytest.mark.parametrize(
    ("provider", "request_name"),
    [
        ("openai", "chat"),
        ("openai", "chat-stream"),
        ("openai", "completions"),
        ("anthropic", "chat"),
        ("azure", "chat"),
        ("anthropic", "chat-stream"),
    ],
)
def test_a_provider_redirect_is_not_followed(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    status: int,
    provider: str,
    request_name: str,
) -> None:
    elsewhere = start_raw(json_answer(ANSWER))  # an internal host, another region's API

    async def redirect(writer: asyncio.StreamWriter, _post: Post) -> bool:
        location = elsewhere.url.encode() + b"/v1/chat/completions"
        writer.write(
            b"HTTP/1.1 %d Moved\r\nlocation: %s\r\ncontent-length: 0\r\n\r\n" % (status, location)
        )
        await writer.drain()
        return False

    redirector = start_raw(redirect)
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    hosted: dict[str, Any] = {**hosted_backend("hosted", redirector.url + "/v1", "m")}
    hosted.update(PROVIDERS[provider])
    gateway = start_gateway(
        [hosted], policy={"paths": [str(tmp_path)]}, environ={"HOSTED_KEY": "test-key"}
    )
    path, body = REQUESTS[request_name]
    response = httpx.post(
        gateway.url + path, json={"model": "m", **body}, headers=gateway.headers, timeout=60
    )
    assert len(redirector.posts) == 1
    assert elsewhere.connections == 0  # the prompt went nowhere the policy did not name
    # its only backend failed: the client gets the 503 every unserved request gets, which
    # names neither the backend nor why (that is the operator's access line, `unserved`)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "backend_unavailable"
    assert "redirect" not in response.text and "hosted" not in response.text


CHUNK = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
    }
)


def test_a_provider_stream_ends_at_the_stream_timeout(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # `limits.stream_timeout_s` bounds every stream: a provider that keeps one going
    # (a chunk well within the read timeout, forever) is cut there as a private one is.
    chunks, written = 400, [0]

    async def endless(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        for _ in range(chunks):
            writer.write(b"data: " + CHUNK + b"\n\n")
            await writer.drain()
            written[0] += 1
            await asyncio.sleep(0.05)  # the fault itself: a stream that never ends
        return False

    provider = start_raw(endless)
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", provider.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"stream_timeout_s": 1.0},
    )
    path, body = REQUESTS["chat-stream"]
    response = httpx.post(
        gateway.url + path, json={"model": "m", **body}, headers=gateway.headers, timeout=60
    )
    events = [e for e in response.text.split("\n\n") if e.startswith("data: {")]
    assert orjson.loads(events[-1][6:])["error"]["code"] == "upstream_timeout"
    assert provider.finished.wait(30)
    assert written[0] < chunks  # the gateway hung up: the provider stopped mid-stream


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {}),
        ("/v1/completions", {"prompt": None}),
        ("/v1/embeddings", {}),
        ("/v1/chat/completions", {}),
    ],
)
def test_a_request_missing_its_required_field_is_a_400_naming_it(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    path: str,
    body: dict[str, Any],
) -> None:
    # A text completion without `prompt` made LiteLLM fail on its own (APIConnectionError):
    # the client got 503 backend_unavailable, as if the provider were down, and the next
    # backend was tried. It is the client's mistake: 400, the field named, nothing sent.
    provider = start_raw(json_answer(ANSWER))
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", provider.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
    )
    response = httpx.post(
        gateway.url + path, json={"model": "m", **body}, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    required = {"/v1/completions": "prompt", "/v1/embeddings": "input"}
    assert error["param"] == required.get(path, "messages")
    assert provider.posts == []


@pytest.mark.parametrize("n", [0, -1])
def test_fewer_than_one_choice_is_a_400_naming_n_never_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    n: int,
) -> None:
    # The gateway counts a whole answer's choices against `n`: a provider answering
    # `n: 0` with its one choice (Gemini reads candidateCount 0 as unset) was 502
    # `upstream_error`, "held 1 choice(s) where 0 were asked", the provider called and
    # blamed (its breaker charged, the next backend tried) for the client's mistake.
    provider = start_raw(json_answer(ANSWER))
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", provider.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
    )
    path, body = REQUESTS["chat"]
    response = httpx.post(
        gateway.url + path, json={"model": "m", **body, "n": n}, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "n"
    assert provider.posts == []


_FLOOD_BYTES = 64 << 20  # what the provider would write, were it never held back


def _event(n: int) -> bytes:
    """A chunked-framed SSE event of 16 KiB of text, each one different (LiteLLM fails a
    stream that repeats one chunk 100 times)."""
    text = (b"%d " % n) * (16384 // len(b"%d " % n))
    chunk = orjson.loads(CHUNK)
    chunk["choices"][0]["delta"]["content"] = text.decode()
    event = b"data: " + orjson.dumps(chunk) + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(event), event)


def test_a_client_that_reads_nothing_holds_back_a_hosted_stream(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fast provider streams 64 MB to a client that reads none of it: the relay waits for
    # the client's buffers to drain (uvicorn's flow control) before it asks LiteLLM for
    # the next chunk, so the provider is held back by TCP, not buffered in the gateway.
    flood: dict[str, Any] = {"written": 0, "blocked": False, "finished": False}

    async def fast(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        n = 0
        while flood["written"] < _FLOOD_BYTES:
            chunk = _event(n)
            n += 1
            writer.write(chunk)
            flood["written"] += len(chunk)
            flood["blocked"] = True
            await writer.drain()
            flood["blocked"] = False
        flood["finished"] = True
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return False

    from uvicorn.protocols.http.flow_control import FlowControl

    draining = threading.Event()  # the relay waits for the client's buffers
    drain = FlowControl.drain

    async def noted_drain(self: FlowControl) -> None:
        draining.set()
        await drain(self)

    monkeypatch.setattr(FlowControl, "drain", noted_drain)
    provider = start_raw(fast)
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", provider.url + "/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
    )
    body = orjson.dumps({"model": "m", **REQUESTS["chat-stream"][1]})
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    try:
        client.connect(("127.0.0.1", gateway.server.port))
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n"
            b"authorization: Bearer %b\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (TENANT_KEY.encode(), len(body), body)
        )
        until(
            lambda: flood["finished"] or (draining.is_set() and flood["blocked"]),
            "the provider held back, or done",
            timeout=300,
            detail=lambda: flood,
        )
        assert not flood["finished"], "the gateway read the whole stream for a client reading none"
        # Socket buffers on both sides hold a few MB at most.
        assert flood["written"] < _FLOOD_BYTES // 2
    finally:
        client.close()
