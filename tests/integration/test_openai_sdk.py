"""The official openai SDK (sync and async) against the gateway, over real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.helpers.gateways import OTHER_KEY, Gateway, Sim

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]


_clients: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().close()


def client(gateway: Gateway, key: str | None = None) -> openai.OpenAI:
    sdk = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key or gateway.key, max_retries=0)
    _clients.append(sdk)
    return sdk


def test_chat_non_stream(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    reply = client(gateway).chat.completions.create(
        model="sim-model",
        messages=MESSAGES,
        max_tokens=5,
    )
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5


def test_chat_stream_with_usage(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    stream = client(gateway).chat.completions.create(
        model="sim-model",
        messages=MESSAGES,
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(content) == 7
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7


def test_completions_stream_and_non_stream(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    sdk = client(gateway)
    whole = sdk.completions.create(model="sim-model", prompt="Once upon", max_tokens=4)
    assert whole.object == "text_completion" and whole.choices[0].text
    parts = list(sdk.completions.create(model="sim-model", prompt="x", max_tokens=4, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) != ""


def test_embeddings(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    result = client(gateway).embeddings.create(model="embed-model", input=["a", "b"])
    assert len(result.data) == 2 and len(result.data[0].embedding) > 0


def test_models_lists_only_what_the_tenant_may_use(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    ids = sorted(m.id for m in client(gateway).models.list())
    assert ids == ["chat", "embed-model", "sim-model"]
    assert list(client(gateway, OTHER_KEY).models.list()) == []


def test_sdk_sees_openai_errors(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    with pytest.raises(openai.AuthenticationError) as auth:
        client(gateway, "og-wrong").chat.completions.create(model="sim-model", messages=MESSAGES)
    assert auth.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as missing:
        client(gateway).chat.completions.create(model="nope", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):  # a tenant without the model cannot tell it exists
        client(gateway, OTHER_KEY).chat.completions.create(model="sim-model", messages=MESSAGES)


def test_async_client_concurrent_streams(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway

    async def main() -> list[int]:
        sdk = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0)

        async def one(n: int) -> int:
            stream = await sdk.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                max_tokens=n,
                stream=True,
            )
            return len([1 async for c in stream if c.choices and c.choices[0].delta.content])

        try:
            non_stream = await sdk.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                max_tokens=3,
            )
            assert non_stream.usage is not None and non_stream.usage.completion_tokens == 3
            return list(await asyncio.gather(*(one(n) for n in range(1, 21))))
        finally:
            await sdk.close()

    assert asyncio.run(main()) == list(range(1, 21))
