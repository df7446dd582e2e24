"""Hosted providers through LiteLLM: OpenAI-shaped answers, mapped errors, no network, no logs.

The OpenAI-shaped provider is the simulator (`openai/<model>` with `api_base=<sim>/v1`);
Anthropic is `tests.helpers.anthropic_mock`. Both run on real local sockets. A guard
refuses (and records) every connection or DNS lookup that is not for loopback, so a
LiteLLM fetch of anything (cost map, beta headers, tokenizers, telemetry) fails the run.
LiteLLM is imported once for the module: the import takes seconds.
"""

from __future__ import annotations

import array
import asyncio
import base64
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.config.provider_routes import route_of
from gateway.config.schema import BackendSettings
from gateway.provenance.formats.upstream_ids import UpstreamIds
from gateway.serving import ServerThread
from gateway.sim import Faults, SimApp, SimSettings, create_sim_app
from gateway.upstream.hosted import HostedClient, HostedError, HostedResponse
from gateway.upstream.litellm_runtime import load_litellm
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.gateways import LITELLM_WARNINGS, Gateway
from tests.helpers.net import free_port
from tests.helpers.raw_backend import Post, RawBackend, json_answer
from tests.helpers.waiting import until

T = TypeVar("T")

pytestmark = LITELLM_WARNINGS

OPENAI_KEY = "sk-openai-from-env-0123456789"
ANTHROPIC_KEY = "sk-ant-from-env-0123456789"
ENV = {"SIM_OPENAI_KEY": OPENAI_KEY, "MOCK_ANTHROPIC_KEY": ANTHROPIC_KEY}
CANARY = "CANARY-5d1f0a9e-hosted-do-not-log"
_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass
class Servers:
    sim: SimApp
    sim_url: str
    anthropic: AnthropicMock
    anthropic_url: str


@pytest.fixture(scope="module", autouse=True)
def no_network() -> Iterator[list[str]]:
    """Refuse and record any non-loopback connect or DNS lookup while these tests run."""
    attempts: list[str] = []
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def connect(sock: socket.socket, address: Any) -> None:
        host = address[0] if isinstance(address, tuple) else str(address)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in _LOOPBACK:
            attempts.append(f"connect {host}")
            raise OSError(f"network access blocked in tests: {host}")
        real_connect(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in _LOOPBACK:
            attempts.append(f"resolve {name}")
            raise socket.gaierror(f"network access blocked in tests: {name}")
        return real_getaddrinfo(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket, "getaddrinfo", getaddrinfo)
        yield attempts
    assert attempts == [], f"LiteLLM tried to reach the network: {attempts}"


@pytest.fixture(scope="module")
def litellm(no_network: list[str]) -> ModuleType:
    return load_litellm()


@pytest.fixture(scope="module")
def servers(litellm: ModuleType) -> Iterator[Servers]:
    settings = SimSettings.for_kind(
        "vllm", models=("gpt-sim", "embed-sim"), zero_latency=True, api_key=OPENAI_KEY
    )
    sim = create_sim_app(settings)
    anthropic = AnthropicMock(api_key=ANTHROPIC_KEY)
    with ServerThread(sim) as sim_server, ServerThread(anthropic) as anthropic_server:
        yield Servers(sim, sim_server.url, anthropic, anthropic_server.url)


@pytest.fixture
def env(servers: Servers) -> Iterator[Servers]:
    """The module's servers, with faults, speed and recordings reset around each test."""
    servers.anthropic.reset()
    yield servers
    servers.sim.control.faults = Faults()
    servers.sim.control.zero_latency = True
    servers.anthropic.reset()


def hosted_backend(url: str | None, provider_model: str, key_env: str | None) -> BackendSettings:
    prefix = provider_model.split("/", 1)[0]
    provider = route_of(provider_model)[0] or prefix  # unprefixed: LiteLLM's default route
    return BackendSettings.model_validate(
        {
            "id": f"{prefix}-hosted",
            "kind": "hosted",
            "provider": provider,
            "base_url": url,
            "models": [{"name": "public", "provider_model": provider_model}],
            "region": "us",
            "owner": provider,
            "api_key_env": key_env,
        }
    )


def openai_client(env: Servers, timeout_s: float = 10.0, url: str | None = None) -> HostedClient:
    backend = hosted_backend(url or f"{env.sim_url}/v1", "openai/gpt-sim", "SIM_OPENAI_KEY")
    return HostedClient(backend, environ=ENV, timeout_s=timeout_s)


def anthropic_client(env: Servers, url: str | None = None) -> HostedClient:
    backend = hosted_backend(
        url or env.anthropic_url, "anthropic/claude-mock-1", "MOCK_ANTHROPIC_KEY"
    )
    return HostedClient(backend, environ=ENV, timeout_s=10.0)


def run(client: HostedClient, scenario: Callable[[], Awaitable[T]]) -> T:
    """Run on a fresh event loop, then close the connections opened on it."""

    async def main() -> T:
        try:
            return await scenario()
        finally:
            await client.aclose()

    return asyncio.run(main())


def chat(content: str = "Say hello", **extra: Any) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": content},
    ]
    return {"model": "public", "messages": messages, "max_tokens": 16, **extra}


async def read_events(response: HostedResponse) -> list[bytes]:
    data = b"".join([chunk async for chunk in response.chunks()])
    assert data.endswith(b"data: [DONE]\n\n")
    events = [e for e in data.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    return [e.removeprefix(b"data: ") for e in events[:-1]]


# -- chat, completions, embeddings in OpenAI shape -----------------------------------------


def test_openai_chat_returns_openai_json_and_sends_the_env_key(env: Servers) -> None:
    client = openai_client(env)
    response = run(client, lambda: client.send("chat", chat(), "public"))
    assert (response.status, response.content_type) == (200, b"application/json")
    assert response.body is not None
    completion = ChatCompletion.model_validate_json(response.body)
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert response.usage == completion.usage.model_dump(
        include={"prompt_tokens", "completion_tokens", "total_tokens"}
    )
    sent = env.sim.captured("/v1/chat/completions")[-1]
    assert sent.header("authorization") == f"Bearer {OPENAI_KEY}".encode()
    assert orjson.loads(sent.body)["model"] == "gpt-sim"


def test_openai_chat_stream_relays_chunks_and_the_usage_chunk(env: Servers) -> None:
    client = openai_client(env)
    doc = chat(stream=True, stream_options={"include_usage": True})

    async def scenario() -> tuple[HostedResponse, list[bytes]]:
        response = await client.send("chat", doc, "public")
        return response, await read_events(response)

    response, events = run(client, scenario)
    assert response.content_type == b"text/event-stream"
    chunks = [ChatCompletionChunk.model_validate_json(e) for e in events]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert response.usage is not None and response.usage["completion_tokens"] == 16


def test_usage_chunk_is_left_out_unless_asked_for(env: Servers) -> None:
    client = openai_client(env)

    async def scenario() -> tuple[HostedResponse, list[bytes]]:
        response = await client.send("chat", chat(stream=True), "public")
        return response, await read_events(response)

    response, events = run(client, scenario)
    assert all(b'"usage"' not in event for event in events)
    assert response.usage is not None  # asked of the provider all the same, for accounting


def test_anthropic_chat_is_translated_both_ways(env: Servers) -> None:
    client = anthropic_client(env)
    response = run(client, lambda: client.send("chat", chat("hello there"), "public"))
    assert response.body is not None
    completion = ChatCompletion.model_validate_json(response.body)
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == "Hello from the Anthropic mock ."
    assert completion.choices[0].finish_reason == "stop"  # Anthropic's end_turn
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (5, 6)
    [received] = env.anthropic.received
    assert (received.method, received.path) == ("POST", "/v1/messages")
    assert received.headers["x-api-key"] == ANTHROPIC_KEY
    assert received.headers["anthropic-version"]
    assert received.body["model"] == "claude-mock-1"
    assert received.body["max_tokens"] == 16
    assert received.body["system"] in (
        "You are terse.",
        [{"type": "text", "text": "You are terse."}],
    )
    [message] = received.body["messages"]
    assert message["role"] == "user"
    assert message["content"] in ("hello there", [{"type": "text", "text": "hello there"}])


def test_the_providers_own_ids_for_an_answer_are_kept(env: Servers) -> None:
    """Hosted providers cannot countersign: their answer id and request-id header are
    what an auditor reconciles with the provider's usage export (completion `upstream`)."""
    anthropic = anthropic_client(env)
    whole = run(anthropic, lambda: anthropic.send("chat", chat(), "public"))
    assert whole.body is not None
    # LiteLLM names a translated answer itself (Anthropic's msg_ id is not kept): the
    # request-id header is what reconciles, and the id LiteLLM made up, which the
    # provider never saw, is not recorded as the provider's.
    assert orjson.loads(whole.body)["id"].startswith("chatcmpl-")
    # The model the answer names (the one the client's body names) is kept too.
    assert UpstreamIds.of(*whole.provider_ids) == UpstreamIds(
        None, (("request-id", "req_mock0001"),), orjson.loads(whole.body)["model"]
    )
    streamed = run(anthropic, lambda: anthropic.send("chat", chat(stream=True), "public"))
    ids = UpstreamIds.of(*streamed.provider_ids)
    assert ids is not None and ids.model is not None
    assert ids == UpstreamIds(None, (("request-id", "req_mock0001"),), ids.model)
    openai = openai_client(env)
    answer = run(openai, lambda: openai.send("chat", chat(), "public"))
    assert answer.body is not None
    ids = UpstreamIds.of(*answer.provider_ids)
    assert ids is not None and ids.response_id == orjson.loads(answer.body)["id"]


def test_anthropic_stream_becomes_openai_chunks(env: Servers) -> None:
    client = anthropic_client(env)
    doc = chat(stream=True, stream_options={"include_usage": True})

    async def scenario() -> tuple[HostedResponse, list[bytes]]:
        response = await client.send("chat", doc, "public")
        return response, await read_events(response)

    response, events = run(client, scenario)
    chunks = [ChatCompletionChunk.model_validate_json(e) for e in events]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from the Anthropic mock ."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert env.anthropic.received[0].body["stream"] is True
    assert response.usage is not None and response.usage["prompt_tokens"] == 5


def test_text_completions_through_the_openai_provider(env: Servers) -> None:
    client = openai_client(env)
    doc = {"model": "public", "prompt": "Once upon", "max_tokens": 5}

    async def scenario() -> tuple[HostedResponse, list[bytes]]:
        whole = await client.send("completions", doc, "public")
        streamed = await client.send("completions", {**doc, "stream": True}, "public")
        return whole, await read_events(streamed)

    whole, events = run(client, scenario)
    assert whole.body is not None
    assert Completion.model_validate_json(whole.body).choices[0].text
    chunks = [orjson.loads(e) for e in events]  # the SDK reads chunks without validation
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)  # LiteLLM's all-zero usage is not relayed


# LiteLLM types `embedding` as list[float] and serialises the response it got; a base64
# string there makes pydantic warn (the value is passed on correctly all the same).
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings_through_the_openai_provider(env: Servers, encoding: str) -> None:
    client = openai_client(env)
    doc = {"model": "public", "input": ["a", "b"], "encoding_format": encoding}
    response = run(client, lambda: client.send("embeddings", doc, "public"))
    assert response.body is not None
    body = orjson.loads(response.body)
    if encoding == "base64":  # what the OpenAI SDK asks for by default; it decodes the data
        for item in body["data"]:
            item["embedding"] = list(array.array("f", base64.b64decode(item["embedding"])))
    parsed = CreateEmbeddingResponse.model_validate(body)
    assert [d.index for d in parsed.data] == [0, 1]
    assert [len(d.embedding) for d in parsed.data] == [16, 16]
    assert parsed.usage.prompt_tokens > 0


# -- what is (not) sent --------------------------------------------------------------------


def test_only_openai_fields_reach_litellm(env: Servers) -> None:
    client = openai_client(env)
    doc = chat(temperature=0.5, metadata={"tag": "x"}, store=False, mock_response=None)
    response = run(client, lambda: client.send("chat", doc, "public"))
    assert response.body is not None
    sent = env.sim.captured("/v1/chat/completions")[-1]
    assert sent.header("authorization") == f"Bearer {OPENAI_KEY}".encode()
    body = orjson.loads(sent.body)
    assert body["temperature"] == 0.5
    assert not {"metadata", "store", "mock_response"} & body.keys()  # asked for nothing


@pytest.mark.parametrize(
    "field",
    ["api_base", "api_key", "extra_headers", "mock_response", "return_token_ids"],
)
def test_a_field_outside_the_openai_allowlist_is_refused_unsent(env: Servers, field: str) -> None:
    client = openai_client(env)
    before = len(env.sim.captured("/v1/chat/completions"))
    value: object = {"x-evil": "1"} if field == "extra_headers" else "x"
    doc = {**chat(), field: value}
    with pytest.raises(HostedError) as refused:
        run(client, lambda: client.send("chat", doc, "public"))
    assert refused.value.status == 400
    # Named if the gateway knows the name; else by its place (the client's text, unrepeated).
    assert refused.value.param == (field if field == "return_token_ids" else "(key 4)")
    assert "not sent" in refused.value.public
    assert len(env.sim.captured("/v1/chat/completions")) == before


def test_the_key_comes_only_from_the_named_environment_variable(env: Servers) -> None:
    backend = hosted_backend(env.anthropic_url, "anthropic/claude-mock-1", "MOCK_ANTHROPIC_KEY")
    with pytest.raises(ValueError, match="MOCK_ANTHROPIC_KEY") as missing:
        HostedClient(backend, environ={}, timeout_s=1)
    assert ANTHROPIC_KEY not in str(missing.value)
    client = HostedClient(backend, environ={"MOCK_ANTHROPIC_KEY": "sk-wrong"}, timeout_s=5)
    assert "sk-wrong" not in repr(client)
    with pytest.raises(HostedError) as refused:
        run(client, lambda: client.send("chat", chat(), "public"))
    assert (refused.value.kind, refused.value.status) == ("status", 401)
    assert env.anthropic.received[-1].headers["x-api-key"] == "sk-wrong"


@pytest.mark.parametrize(
    ("provider_model", "variable"),
    [
        ("openai/gpt-sim", "OPENAI_BASE_URL"),
        ("openai/gpt-sim", "OPENAI_API_BASE"),
        ("gpt-sim", "OPENAI_BASE_URL"),
        ("anthropic/claude-mock-1", "ANTHROPIC_BASE_URL"),
        ("anthropic/claude-mock-1", "ANTHROPIC_API_BASE"),
    ],
)
def test_a_provider_url_variable_cannot_redirect_a_backend_without_base_url(
    env: Servers, provider_model: str, variable: str
) -> None:
    # Without `base_url` LiteLLM takes the provider's URL from these variables, and sends
    # the backend's key there: the gateway refuses to build such a backend.
    environ = {**ENV, variable: f"{env.sim_url}/v1"}
    backend = hosted_backend(None, provider_model, "SIM_OPENAI_KEY")
    with pytest.raises(ValueError, match=variable) as refused:
        HostedClient(backend, environ=environ, timeout_s=1)
    assert "set base_url" in str(refused.value) and env.sim_url not in str(refused.value)
    pinned = hosted_backend(f"{env.sim_url}/v1", provider_model, "SIM_OPENAI_KEY")
    HostedClient(pinned, environ=environ, timeout_s=1)  # base_url set: the config decides
    azure = hosted_backend(None, "azure/gpt-eu", "SIM_OPENAI_KEY")  # no default URL
    endpoint = {**environ, "AZURE_API_BASE": "https://acme-eu.openai.azure.com"}
    HostedClient(azure, environ=endpoint, timeout_s=1)  # told where by its variable
    with pytest.raises(ValueError, match=r"AZURE_API_BASE: host '127\.0\.0\.1'"):
        HostedClient(azure, environ={**environ, "AZURE_API_BASE": env.sim_url}, timeout_s=1)


def test_an_unprefixed_model_is_refused_under_its_providers_variable(env: Servers) -> None:
    # LiteLLM resolves `claude-sonnet-4-5` to Anthropic from its model lists, and would
    # send the key to ANTHROPIC_API_BASE: an unprefixed name counts every provider's.
    assert load_litellm().get_llm_provider("claude-sonnet-4-5")[1] == "anthropic"
    environ = {**ENV, "ANTHROPIC_API_BASE": f"{env.sim_url}/v1"}
    backend = hosted_backend(None, "claude-sonnet-4-5", "SIM_OPENAI_KEY")
    with pytest.raises(ValueError, match="ANTHROPIC_API_BASE"):
        HostedClient(backend, environ=environ, timeout_s=1)


def test_a_providers_short_variable_name_is_refused_too(env: Servers) -> None:
    # LiteLLM takes `fireworks_ai/`'s URL from FIREWORKS_API_BASE (not FIREWORKS_AI_...).
    model = "fireworks_ai/accounts/fireworks/models/llama-v3p1-8b-instruct"
    base = f"{env.sim_url}/v1"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FIREWORKS_API_BASE", base)
        assert load_litellm().get_llm_provider(model, api_key="k")[3] == base
    backend = hosted_backend(None, model, "SIM_OPENAI_KEY")
    with pytest.raises(ValueError, match="FIREWORKS_API_BASE"):
        HostedClient(backend, environ={**ENV, "FIREWORKS_API_BASE": base}, timeout_s=1)


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("status", "error_type"), [(529, "overloaded_error"), (400, "invalid_request_error")]
)
def test_provider_status_errors_keep_the_provider_status(
    env: Servers, stream: bool, status: int, error_type: str
) -> None:
    env.anthropic.error = (status, error_type)
    client = anthropic_client(env)
    with pytest.raises(HostedError) as caught:
        run(client, lambda: client.send("chat", chat(stream=stream), "public"))
    assert (caught.value.kind, caught.value.status) == ("status", status)
    assert caught.value.message == f"anthropic answered HTTP {status} ({error_type})"


def test_openai_provider_error_status(env: Servers) -> None:
    env.sim.control.faults = Faults(error_rate=1.0)
    client = openai_client(env)
    with pytest.raises(HostedError) as caught:
        run(client, lambda: client.send("chat", chat(), "public"))
    assert (caught.value.kind, caught.value.status) == ("status", 500)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_refused_connection_is_a_connect_error(env: Servers, provider: str) -> None:
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}"
    if provider == "openai":
        client = openai_client(env, url=f"{url}/v1")
    else:
        client = anthropic_client(env, url=url)
    with pytest.raises(HostedError) as caught:
        run(client, lambda: client.send("chat", chat(), "public"))
    assert (caught.value.kind, caught.value.status) == ("connect", None)
    assert str(port) not in caught.value.message and "127.0.0.1" not in caught.value.message


@pytest.mark.parametrize("stream", [False, True])
def test_hanging_provider_times_out(env: Servers, stream: bool) -> None:
    # LiteLLM's first call in a process does a second or more of one-off work (more on a
    # busy machine) before it sends: done here, outside the time measured below, so that
    # the bound is on what the timeout does whichever test runs first.
    warm = openai_client(env)
    run(warm, lambda: warm.send("chat", chat(), "public"))
    env.sim.control.faults = Faults(hang_rate=1.0)
    client = openai_client(env, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(HostedError) as caught:
        run(client, lambda: client.send("chat", chat(stream=stream), "public"))
    assert caught.value.kind == "timeout"
    assert time.monotonic() - started < 3


def test_a_dripping_answer_times_out_at_the_response_deadline(litellm: ModuleType) -> None:
    # Each byte well within LiteLLM's per-read timeout: only a total deadline ends it.
    answer = orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        }
    )
    body = b" " * 500 + answer  # ~14 s at one byte per 20 ms
    written = [0]

    async def drip(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(body))
        for i in range(len(body)):
            await writer.drain()
            writer.write(body[i : i + 1])
            written[0] += 1
            await asyncio.sleep(0.02)  # the fault itself: a body that keeps trickling in
        return False

    raw = RawBackend(drip).start()
    try:
        backend = hosted_backend(f"{raw.url}/v1", "openai/gpt-sim", "SIM_OPENAI_KEY")
        client = HostedClient(backend, environ=ENV, timeout_s=5.0, response_timeout_s=0.5)
        with pytest.raises(HostedError) as caught:
            run(client, lambda: client.send("chat", chat(), "public"))
        assert caught.value.kind == "timeout"
        assert raw.finished.wait(30)
        assert written[0] < len(body)  # the call was cancelled mid-body
    finally:
        raw.stop()


@pytest.mark.parametrize(("code", "status"), [(400, 400), (401, 401), ("invalid_api_key", 500)])
def test_an_error_object_in_a_200_answer_is_the_providers_not_repeated(
    litellm: ModuleType, code: object, status: int
) -> None:
    # OpenRouter-style: HTTP 200, `{"error": {...}}`. LiteLLM carries the provider's text,
    # which may quote the prompt and the key, in an exception that looks like its own
    # refusal of the request ("not sent"): that text must not reach the client.
    text = f"Your prompt {CANARY} was refused; key provided: sk-...abcd"
    answer = orjson.dumps(
        {"error": {"message": text, "type": "invalid_request_error", "code": code}}
    )

    refuse = json_answer(answer)

    raw = RawBackend(refuse).start()
    try:
        backend = hosted_backend(f"{raw.url}/v1", "openai/gpt-sim", "SIM_OPENAI_KEY")
        client = HostedClient(backend, environ=ENV, timeout_s=5.0)
        with pytest.raises(HostedError) as caught:
            run(client, lambda: client.send("chat", chat(f"my secret is {CANARY}"), "public"))
    finally:
        raw.stop()
    error = caught.value
    assert (error.kind, error.status) == ("status", status)
    assert error.message == f"openai answered HTTP 200 with an error (code {status})"
    for leak in (CANARY, "abcd", "refused", "not sent"):
        assert leak not in error.message


def test_stream_that_breaks_off_raises_from_chunks(env: Servers) -> None:
    env.sim.control.faults = Faults(die_mid_stream_rate=1.0)
    client = openai_client(env)

    got: list[bytes] = []

    async def scenario() -> None:
        response = await client.send("chat", chat(stream=True), "public")
        async for data in response.chunks():
            got.append(data)

    with pytest.raises(HostedError) as caught:
        run(client, scenario)
    assert caught.value.kind == "protocol"
    assert got and not got[-1].endswith(b"[DONE]\n\n")  # some chunks came before the break


# -- cancellation --------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_aclose_mid_stream_stops_the_provider_stream(env: Servers, provider: str) -> None:
    env.sim.control.zero_latency = False  # ~60 tokens/s: the stream lasts seconds
    env.anthropic.reset(reply=" ".join(["word"] * 200))
    env.anthropic.event_delay_s = 0.02
    client = openai_client(env) if provider == "openai" else anthropic_client(env)
    before = env.sim.stats.cancelled

    async def scenario() -> list[bytes]:
        response = await client.send("chat", chat(stream=True, max_tokens=200), "public")
        got: list[bytes] = []
        async for data in response.chunks():
            got.append(data)
            if len(got) == 3:
                await response.aclose()
        return got

    assert len(run(client, scenario)) == 3  # nothing more after aclose(), and no [DONE]

    def stopped() -> bool:
        if provider == "openai":
            return env.sim.stats.cancelled > before
        return env.anthropic.disconnects == 1

    until(stopped, f"the {provider} upstream request stopped", timeout=30.0)


# -- client errors are the client's (400), not a provider outage (503) ---------------------


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("messages", "hello", "messages"),
        ("messages", ["hello"], "messages[0]"),
        ("messages", [{"role": "user", "content": 5}], "messages[0].content"),
        ("messages", [{"role": "user", "content": [{"type": "nope"}]}], "messages[0].content[0]"),
        ("messages", [{"role": "system", "content": None}], "messages[0].content"),
        (
            "messages",
            [{"role": "system", "content": [{"type": "image_url"}]}],
            "messages[0].content[0]",
        ),
        ("response_format", {}, "response_format.type"),
        ("tools", [{"type": "function"}], "tools[0].function"),
        ("stop", [1, 2], "stop"),
        ("max_tokens", "many", "max_tokens"),
        ("max_tokens", 1.2e29, "max_tokens"),
        ("temperature", True, "temperature"),
        ("response_format", "json", "response_format"),
    ],
)
def test_fields_litellm_cannot_take_are_refused_before_sending(
    env: Servers, field: str, value: Any, param: str
) -> None:
    client = anthropic_client(env)
    with pytest.raises(HostedError) as caught:
        run(client, lambda: client.send("chat", {**chat(), field: value}, "public"))
    assert (caught.value.kind, caught.value.status, caught.value.param) == ("status", 400, param)
    assert "not sent" in caught.value.message and repr(value) not in caught.value.message
    # The client's words name the field, not the provider the request was headed for.
    public = caught.value.public
    assert public.startswith("the request is not valid for this model's provider (not sent)")
    assert "anthropic" not in public.lower() and repr(value) not in public
    assert env.anthropic.received == []


def test_litellm_local_rejection_keeps_a_safe_reason(env: Servers) -> None:
    client = anthropic_client(env)
    doc = chat(f"my secret is {CANARY}")
    doc["messages"].append({"role": "bogus", "content": CANARY})
    with pytest.raises(HostedError) as caught:
        run(client, lambda: client.send("chat", doc, "public"))
    error = caught.value
    assert (error.kind, error.status) == ("status", 400)
    assert error.message.startswith("the request is not valid for anthropic (HTTP 400, not sent)")
    assert "Invalid Message" in error.message
    for leak in (CANARY, "bogus", ANTHROPIC_KEY, env.anthropic_url, "litellm"):
        assert leak not in error.message
    # What the client reads: the same reason, no provider named (the operator's has it).
    assert error.public.startswith(
        "the request is not valid for this model's provider (HTTP 400, not sent)"
    )
    assert "Invalid Message" in error.public and "anthropic" not in error.public.lower()
    assert env.anthropic.received == []


def test_the_user_content_types_are_litellms(litellm: ModuleType) -> None:
    from litellm.types.llms.openai import ValidUserMessageContentTypes

    from gateway.upstream.openai_messages import USER_CONTENT_TYPES

    assert set(ValidUserMessageContentTypes) == USER_CONTENT_TYPES


def _hosted_only_gateway(
    env: Servers, start_gateway: Callable[..., Gateway], tmp_path: Path
) -> Gateway:
    """A gateway whose model `public` only the Anthropic mock serves, as the policy allows."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "hosted.yaml").write_text(
        "apiVersion: policy.owngate.dev/v1\nkind: Policy\n"
        'metadata: {id: hosted-ok, version: "1"}\n'
        "spec:\n  tenants: [acme]\n  residency: {allow: ['*']}\n"
        "  retention: {max_days: 30}\n"
        "  fallback: {mode: when_private_unavailable, to: [{backend: anthropic-hosted}]}\n"
    )
    backend = hosted_backend(
        env.anthropic_url, "anthropic/claude-mock-1", "MOCK_ANTHROPIC_KEY"
    ).model_dump(mode="json", exclude_none=True)
    return start_gateway([backend], environ=ENV, policy={"paths": [str(policies)]})


def test_a_request_litellm_rejects_is_a_400_upstream_bad_request(
    env: Servers, start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    gateway = _hosted_only_gateway(env, start_gateway, tmp_path)
    url = f"{gateway.url}/v1/chat/completions"
    ok = httpx.post(url, json=chat(), headers=gateway.headers, timeout=30)
    assert ok.status_code == 200, ok.text  # the route is open: hosted serves `public`
    sent = len(env.anthropic.received)
    bad = chat()
    bad["messages"].append({"role": "bogus", "content": "x"})  # LiteLLM: not sent
    shapes = chat()
    shapes["messages"] = "hello"  # LiteLLM would fail on it as if the provider had
    field = {**chat(), "stop": [1, 2]}  # the gateway's own check (`prepare`): not sent
    for doc in (bad, shapes, field):
        response = httpx.post(url, json=doc, headers=gateway.headers, timeout=30)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "upstream_bad_request"
        assert "not sent" in error["message"] and "127.0.0.1" not in error["message"]
        # The provider the request was headed for is a routing internal (docs/security.md).
        assert "anthropic" not in error["message"].lower(), error["message"]
    assert "stop" in error["message"] and error["param"] == "stop"  # which field, still
    assert len(env.anthropic.received) == sent  # nothing reached the provider


def test_a_provider_400_is_the_clients_400(
    env: Servers, start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    gateway = _hosted_only_gateway(env, start_gateway, tmp_path)
    env.anthropic.error = (400, "invalid_request_error")
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=chat(), headers=gateway.headers, timeout=30
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_bad_request"
    assert error["message"] == "the provider answered HTTP 400 (invalid_request_error)"


# -- quiet and lazy ------------------------------------------------------------------------


def test_no_prompt_reaches_any_log(
    env: Servers, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="LiteLLM")  # even if someone lowers its level
    client = anthropic_client(env)
    doc = chat(f"my secret is {CANARY}")

    async def scenario() -> HostedError:
        await client.send("chat", doc, "public")
        await read_events(await client.send("chat", {**doc, "stream": True}, "public"))
        env.anthropic.error = (400, "invalid_request_error")
        env.anthropic.error_message = f"messages.0: cannot process {CANARY}"
        try:
            await client.send("chat", doc, "public")
        except HostedError as exc:
            return exc
        raise AssertionError("the provider error did not surface")

    error = run(client, scenario)
    assert CANARY not in error.message
    assert error.__cause__ is None and error.__context__ is None  # LiteLLM's text not kept
    out, err = capfd.readouterr()
    assert CANARY not in caplog.text + out + err
    assert not [r for r in caplog.records if r.name.startswith("LiteLLM")]


_FIRST_CALL_SCRIPT = """
import asyncio, socket, sys, time

attempts = []
real_getaddrinfo = socket.getaddrinfo
def getaddrinfo(host, *args, **kwargs):
    if host not in ("127.0.0.1", "localhost"):
        attempts.append(host)
        raise socket.gaierror("network access blocked in tests")
    return real_getaddrinfo(host, *args, **kwargs)
socket.getaddrinfo = getaddrinfo

from gateway.config.schema import BackendSettings
from gateway.serving import bind_socket
from gateway.upstream.hosted import HostedClient, HostedError
from gateway.upstream.litellm_runtime import aload_litellm

def imported():
    return any(m == "litellm" or m.startswith("litellm.") for m in sys.modules)

# Bound, never listening, held for the whole run: connecting is refused, and no other
# process (another test run beside this one) can take the port in between.
probe = bind_socket("127.0.0.1", 0, listen=False)
url = "http://127.0.0.1:%d/v1" % probe.getsockname()[1]
backend = BackendSettings.model_validate({"id": "h", "kind": "hosted", "region": "us", "owner": "o",
    "base_url": url, "api_key_env": "K", "models": [{"name": "g", "provider_model": "openai/g"}]})
client = HostedClient(backend, environ={"K": "sk-test"}, timeout_s=2)
print("imported before the first call:", imported())

async def main():
    pauses = []
    async def tick():
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            pauses.append(now - last)
            last = now
    ticker = asyncio.create_task(tick())
    await aload_litellm()
    ticker.cancel()
    print("loop ticks during the import:", len(pauses), "longest pause:", max(pauses))
    try:
        await client.send("chat", {"messages": [{"role": "user", "content": "hi"}]}, "g")
    except HostedError as exc:
        print("error kind:", exc.kind)
    await client.aclose()

asyncio.run(main())
print("imported after the first call:", imported())
print("network attempts:", attempts)
"""


def test_litellm_is_imported_on_first_call_without_stalling_the_loop() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert lines["imported before the first call"] == "False"
    assert lines["imported after the first call"] == "True"
    assert lines["error kind"] == "connect"
    assert lines["network attempts"] == "[]"
    ticks, pause = lines["loop ticks during the import"].split(" longest pause: ")
    # The import runs in a worker thread, so the event loop keeps turning while it runs:
    # an import on the loop's own thread would let the ticker run not even once before
    # it returned. (No bound on the longest pause: that measures how busy the machine
    # is, not where the import ran.)
    assert int(ticks) >= 2, done.stdout
    assert float(pause) > 0, done.stdout


_ODD_ANSWER_SCRIPT = """
import asyncio, sys
from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError

backend = BackendSettings.model_validate({"id": "h", "kind": "hosted", "region": "us",
    "owner": "o", "base_url": sys.argv[1], "api_key_env": "K",
    "models": [{"name": "g", "provider_model": "openai/g"}]})
client = HostedClient(backend, environ={"K": "sk-test"}, timeout_s=5)

async def main():
    try:
        await client.send("chat", {"messages": [{"role": "user", "content": "hi"}]}, "g")
    except HostedError as exc:
        print("error kind:", exc.kind)
    await client.aclose()

asyncio.run(main())
"""


def test_an_answer_of_an_odd_shape_puts_none_of_its_text_on_stderr() -> None:
    # Python's default warning filters, as `owngate serve` runs: pydantic's serializer
    # warning for LiteLLM's dump of this answer quotes the value (`input_value=...`).
    text = f"the answer is {CANARY} and more of the provider's words"
    answer = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": text})

    odd = json_answer(answer)

    raw = RawBackend(odd).start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _ODD_ANSWER_SCRIPT, f"{raw.url}/v1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        raw.stop()
    assert done.returncode == 0, done.stderr
    assert done.stdout == "error kind: protocol\n"
    assert CANARY[:12] not in done.stderr and "provider's words" not in done.stderr, done.stderr


def test_the_network_guard_refuses_public_hosts(no_network: list[str]) -> None:
    with pytest.raises(OSError, match="blocked"):
        socket.create_connection(("192.0.2.1", 443), timeout=1)  # TEST-NET-1, RFC 5737
    assert no_network.pop() in ("resolve 192.0.2.1", "connect 192.0.2.1")
