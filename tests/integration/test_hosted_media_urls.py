"""A content-part URL is not fetched from the gateway's network on a hosted call, and an
embeddings `input` is not read as an object stored in the provider account.

LiteLLM's GigaChat adapter downloads an `image_url` itself (no address guard, TLS
unchecked) and uploads the bytes to the provider: a client could so read a loopback or
internal service through the gateway. A loopback server stands for both the internal
service (`/secret.png`) and the provider (`/files`, `/chat/completions`); it records
every request. LiteLLM's own guard covers Anthropic: the gateway refuses first either way.
"""

from __future__ import annotations

import asyncio
import http.server
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient
from gateway.upstream.hosted_errors import HostedError
from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.http_thread import serving

pytestmark = LITELLM_WARNINGS

_ANSWER = orjson.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "GigaChat",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)


def _embeddings(request: bytes) -> bytes:
    """One embedding for each input of `request` (a string or a token array is one)."""
    given = orjson.loads(request).get("input")
    count = (
        len(given) if isinstance(given, list) and not all(isinstance(i, int) for i in given) else 1
    )
    data = [{"object": "embedding", "index": i, "embedding": [0.1, 0.2]} for i in range(count)]
    usage = {"prompt_tokens": 1, "total_tokens": 1}
    return orjson.dumps(
        {"object": "list", "model": "text-embedding-3-small", "data": data, "usage": usage}
    )


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: list[str]

    def do_GET(self) -> None:
        self.hits.append(f"GET {self.path}")
        self._answer(b"image/png", b"\x89PNG\r\n\x1a\nsecret")

    def do_POST(self) -> None:
        self.hits.append(f"POST {self.path}")
        request = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"id": "file-1"}' if self.path.endswith("/files") else _ANSWER
        if self.path.endswith("/embeddings"):
            body = _embeddings(request)
        self._answer(b"application/json", body)

    def _answer(self, content_type: bytes, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", content_type.decode())
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        """Quiet."""


@pytest.fixture
def loopback() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    handler = type("Handler", (_Recorder,), {"hits": hits})
    with serving(handler) as url:
        yield url, hits


def hosted(url: str, provider: str, provider_model: str) -> HostedClient:
    """A hosted backend of `provider` at `url` (the recording server) serving `public`."""
    backend = BackendSettings.model_validate(
        {
            "id": provider,
            "kind": "hosted",
            "provider": provider,
            "base_url": url,
            "models": [{"name": "public", "provider_model": provider_model}],
            "region": "eu",
            "owner": provider,
            "api_key_env": "HOSTED_KEY",
        }
    )
    return HostedClient(backend, environ={"HOSTED_KEY": "k"}, timeout_s=10.0)


def gigachat(url: str) -> HostedClient:
    return hosted(url, "gigachat", "gigachat/GigaChat")


def chat(image_url: str) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": image_url}}
    content = [{"type": "text", "text": "describe"}, part]
    return {"model": "public", "messages": [{"role": "user", "content": content}]}


def test_an_internal_url_is_refused_before_any_adapter_fetches_it(
    loopback: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, hits = loopback
    # LiteLLM reads GigaChat's token from the process environment: no OAuth round trip.
    monkeypatch.setenv("GIGACHAT_ACCESS_TOKEN", "token")
    client = gigachat(url)

    async def send() -> None:
        await client.send("chat", chat(f"{url}/secret.png"), "public")

    with pytest.raises(HostedError) as refused:
        asyncio.run(send())
    assert refused.value.status == 400
    assert refused.value.param == "messages[0].content[1]"
    assert "secret.png" not in refused.value.message
    assert hits == []  # neither the internal service nor the provider saw anything


def test_a_data_url_still_reaches_the_provider(
    loopback: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, hits = loopback
    monkeypatch.setenv("GIGACHAT_ACCESS_TOKEN", "token")
    client = gigachat(url)

    async def send() -> int:
        response = await client.send("chat", chat("data:image/png;base64,iVBORw0KGgo="), "public")
        return len(response.body or b"")

    assert asyncio.run(send()) > 0
    assert [h.split(" ")[0] for h in hits] == ["POST", "POST"]  # upload, then the chat


@pytest.mark.parametrize(
    "image_url",
    [
        "gs://another-tenant/scan.png",
        "https://generativelanguage.googleapis.com/v1beta/files/another-tenants-upload",
        "{url}/secret.png",
    ],
)
def test_an_assistants_own_images_are_checked_before_the_gemini_adapter_sends_them(
    loopback: tuple[str, list[str]], image_url: str
) -> None:
    # LiteLLM's Gemini adapter sends an assistant message's `images` (its shape of the
    # images a Gemini model generated) as parts of that turn: a `gs://` object or a Files
    # API upload as `file_data.file_uri`, which Google reads with the gateway's
    # credentials, shared by every tenant. They passed unchecked (only content parts were).
    url, hits = loopback
    client = hosted(url, "gemini", "gemini/gemini-2.0-flash")
    images = [{"type": "image_url", "image_url": {"url": image_url.replace("{url}", url)}}]
    messages = [
        {"role": "user", "content": "draw a cat"},
        {"role": "assistant", "content": "here", "images": images},
        {"role": "user", "content": "again"},
    ]

    async def send() -> None:
        await client.send("chat", {"model": "public", "messages": messages}, "public")

    with pytest.raises(HostedError) as refused:
        asyncio.run(send())
    assert (refused.value.status, refused.value.param) == (400, "messages[1].images")
    assert "another-tenant" not in refused.value.message
    assert "secret.png" not in refused.value.message
    assert hits == []  # the provider (and the internal service) got nothing


def embedder(url: str) -> HostedClient:
    return hosted(url, "openai", "openai/text-embedding-3-small")


@pytest.mark.parametrize(
    ("given", "param"),
    [
        # Vertex multimodal embeddings read a string holding `gs://` as a Cloud Storage
        # object, Gemini's `files/...` as a stored file, Bedrock Nova's `s3://` as an S3
        # object: each with the gateway's credentials, which every tenant shares.
        ("gs://another-tenant/scan.png", "input"),
        (["a caption", "gs://another-tenant/scan.png"], "input[1]"),
        (["s3://another-tenant/report.pdf"], "input[0]"),
        ("files/abc123", "input"),
        # An object in the array is a multimodal instance to Vertex, a file block to Gemini.
        (["x", {"image": {"gcsUri": "gs://another-tenant/scan.png"}}], "input[1]"),
    ],
)
def test_an_embeddings_input_naming_a_stored_object_is_refused_before_the_provider(
    loopback: tuple[str, list[str]], given: Any, param: str
) -> None:
    url, hits = loopback
    client = embedder(url)

    async def send() -> None:
        await client.send("embeddings", {"model": "public", "input": given}, "public")

    with pytest.raises(HostedError) as refused:
        asyncio.run(send())
    assert (refused.value.status, refused.value.param) == (400, param)
    assert "another-tenant" not in refused.value.message
    assert hits == []  # the provider was never called


@pytest.mark.parametrize("given", ["a caption", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_text_and_tokens_still_reach_the_embeddings_provider(
    loopback: tuple[str, list[str]], given: Any
) -> None:
    url, hits = loopback
    client = embedder(url)

    async def send() -> bytes:
        response = await client.send("embeddings", {"model": "public", "input": given}, "public")
        return response.body or b""

    assert b"embedding" in asyncio.run(send())
    assert hits == ["POST /embeddings"]


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        # LiteLLM makes each item of a prompt array a user message's content: an array of
        # content parts there reached the GigaChat adapter, which downloaded the URL.
        (
            ["describe", [{"type": "image_url", "image_url": {"url": "{url}/secret.png"}}]],
            "prompt[1]",
        ),
        (["describe", [{"type": "file", "file": {"file_id": "file-of-another"}}]], "prompt[1]"),
        ([{"type": "text", "text": "describe"}], "prompt[0]"),
    ],
)
def test_a_text_completion_prompt_is_text_or_tokens_never_content_parts(
    loopback: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch, prompt: Any, param: str
) -> None:
    url, hits = loopback
    monkeypatch.setenv("GIGACHAT_ACCESS_TOKEN", "token")
    client = gigachat(url)
    given = orjson.loads(orjson.dumps(prompt).replace(b"{url}", url.encode()))

    async def send() -> None:
        await client.send("completions", {"model": "public", "prompt": given}, "public")

    with pytest.raises(HostedError) as refused:
        asyncio.run(send())
    assert (refused.value.status, refused.value.param) == (400, param)
    assert hits == []  # neither the internal service nor the provider saw anything


@pytest.mark.parametrize("prompt", ["describe gs://bucket/x", ["one", "two"]])
def test_a_text_prompt_still_reaches_the_provider(
    loopback: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch, prompt: Any
) -> None:
    url, hits = loopback
    monkeypatch.setenv("GIGACHAT_ACCESS_TOKEN", "token")
    client = gigachat(url)

    async def send() -> bytes:
        response = await client.send("completions", {"model": "public", "prompt": prompt}, "public")
        return response.body or b""

    if isinstance(prompt, str):
        assert b"text_completion" in asyncio.run(send())
        assert hits and all(hit == "POST /chat/completions" for hit in hits)
        return
    # LiteLLM would ask one chat of both prompts, one answer for two: refused unsent
    # (before: sent, then 502 for the one choice it held).
    with pytest.raises(HostedError, match="must be a single prompt") as refused:
        asyncio.run(send())
    assert refused.value.status == 400
    assert hits == []
