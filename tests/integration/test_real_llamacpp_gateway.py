"""The gateway in front of a real llama.cpp `llama-server` (installed from PyPI, tiny model)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from tests.helpers.gateways import Gateway, backend, readiness
from tests.helpers.real_backend.server import LlamaServer
from tests.helpers.waiting import until

pytestmark = pytest.mark.real_backend


@pytest.fixture
def gateway(real_llamacpp: LlamaServer, start_gateway: Callable[..., Gateway]) -> Gateway:
    entry = {"name": real_llamacpp.alias, "aliases": ["llama-small"]}
    return start_gateway(
        [backend("cpu-llama", real_llamacpp.base_url, entry, kind="llamacpp")],
        scrape={"interval_s": 0.1, "staleness_s": 2.0},
    )


@pytest.fixture
def sdk(gateway: Gateway) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0)
    yield client
    client.close()


def test_chat_non_stream_and_stream(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(
        model="llama-small", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    stream = sdk.chat.completions.create(
        model="llama-small",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_completions(sdk: openai.OpenAI) -> None:
    whole = sdk.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6)
    assert whole.choices[0].text
    parts = list(sdk.completions.create(model="tiny", prompt="x", max_tokens=6, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices)


def test_models(sdk: openai.OpenAI) -> None:
    assert sorted(m.id for m in sdk.models.list()) == ["llama-small", "tiny"]


def test_real_backend_error_is_translated(gateway: Gateway) -> None:
    # More tokens than a 1024-token slot holds: llama.cpp refuses; the client gets a 400.
    body = {"model": "tiny", "prompt": "word " * 3000, "max_tokens": 4}
    response = httpx.post(
        f"{gateway.url}/v1/completions", json=body, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "upstream_bad_request"


def test_gateway_reads_the_real_metrics(gateway: Gateway) -> None:
    until(
        lambda: readiness(gateway.url)["backends"]["cpu-llama"]["metrics_age_s"] is not None,
        "a first scrape of cpu-llama",
        timeout=30.0,
        interval=0.05,
    )
    detail = readiness(gateway.url)["backends"]["cpu-llama"]
    assert detail["metrics_error"] is None
    assert detail["running"] == 0 and detail["waiting"] == 0
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    assert 'owngate_backend_waiting{backend="cpu-llama"} 0.0' in text


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_a_stream_without_include_usage_is_charged_without_a_usage_chunk(
    real_llamacpp: LlamaServer, start_gateway: Callable[..., Gateway], endpoint: str
) -> None:
    from gateway.tenants import hash_api_key
    from tests.helpers.gateways import TENANT_KEY

    limits = {"tokens_per_minute": 100}
    tenant = {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}
    gateway = start_gateway(
        [backend("cpu-llama", real_llamacpp.base_url, real_llamacpp.alias, kind="llamacpp")],
        tenants=[{**tenant, "limits": limits}],
    )
    prompt = (
        {"messages": [{"role": "user", "content": "Hello"}]}
        if endpoint == "chat/completions"
        else {"prompt": "Once upon a time"}
    )
    body = {"model": real_llamacpp.alias, "max_tokens": 60, "stream": True, **prompt}
    url = f"{gateway.url}/v1/{endpoint}"
    first = httpx.post(url, json=body, headers=gateway.headers, timeout=60)
    assert first.status_code == 200
    assert '"choices":[],' not in first.text.replace(" ", "")  # no usage-only chunk
    assert "data: [DONE]" in first.text
    # llama.cpp reported ~60+ tokens against a 100-token budget: the next one waits.
    statuses = [first.status_code]
    for _ in range(3):
        statuses.append(httpx.post(url, json=body, headers=gateway.headers, timeout=60).status_code)
        if statuses[-1] == 429:
            break
    assert statuses[-1] == 429 and len(statuses) <= 3
