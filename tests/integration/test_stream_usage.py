"""Token budgets and records hold for streams whose client did not ask for usage.

The gateway asks a private backend for the usage chunk (`stream_options.include_usage`)
when it needs the counts (a token budget, the provenance log) and the client did not,
keeps that chunk from the client, charges the budget and writes the counts into the
completion record. A backend that reports no usage is charged an estimate; a hosted
provider's usage, which LiteLLM reports apart, is charged too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    TENANT_KEY,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    logged_private_gateway,
)
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

ORIGIN = "test.owngate/usage"
PROMPT = {"model": "m", "messages": [{"role": "user", "content": "count to ten"}]}


def tenants(**limits: int) -> list[dict[str, Any]]:
    return [
        {
            "id": "acme",
            "api_key_hashes": [hash_api_key(TENANT_KEY)],
            "models": ["*"],
            "limits": limits,
        }
    ]


def stream(gateway: Gateway, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions", content=body, headers=gateway.headers, timeout=60
    )


def body(**extra: Any) -> bytes:
    return orjson.dumps({**PROMPT, "stream": True, **extra})


def statuses_until_refused(gateway: Gateway, request: bytes, most: int) -> list[int]:
    statuses: list[int] = []
    for _ in range(most):
        response = stream(gateway, request)
        statuses.append(response.status_code)
        if response.status_code == 429:
            break
        assert '"usage"' not in response.text  # the client did not ask for it
        assert "data: [DONE]" in response.text
    return statuses


@pytest.mark.parametrize(
    "options",
    [{}, {"stream_options": {"include_usage": False}}, {"stream_options": None}],
    ids=["absent", "false", "null"],
)
def test_a_stream_without_include_usage_is_charged_to_the_budget(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], options: dict[str, Any]
) -> None:
    # A client saying it wants no usage (`false`, `null`) is asked for it all the same.
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway([backend("gpu", sim.url, "m")], tenants=tenants(tokens_per_minute=600))
    # ~210 tokens each: the fourth finds the minute's 600 spent (it was 24 x 200 before).
    statuses = statuses_until_refused(gateway, body(max_tokens=200, **options), most=8)
    # LiteLLM's counts of the simulator's text differ a little from the simulator's own.
    assert statuses[-1] == 429 and len(statuses) <= 5
    sent = sim.app.captured("/v1/chat/completions")[0].body
    assert orjson.loads(sent)["stream_options"] == {"include_usage": True}


def test_the_usage_chunk_is_asked_for_kept_from_the_client_and_recorded(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = logged_private_gateway(start_gateway, tmp_path, sim.url, ORIGIN)
    sent = b'  {"model": "m", "stream": true, "max_tokens": 5, "messages": [{"role": "user", '
    sent += b'"content": "hi"}]}'
    response = stream(gateway, sent)
    assert response.status_code == 200
    assert '"usage"' not in response.text
    assert "data: [DONE]" in response.text
    # Only the option was spliced in: every other byte went as the client sent it.
    upstream = sim.app.captured("/v1/chat/completions")[-1].body
    assert upstream == b'  {"stream_options":{"include_usage":true},' + sent[3:]
    usage = completion_record(tmp_path / "log", response.headers["x-request-id"])["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


def test_a_client_that_asks_for_usage_gets_its_body_through_unchanged(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = logged_private_gateway(start_gateway, tmp_path, sim.url, ORIGIN)
    sent = body(max_tokens=4, stream_options={"include_usage": True})
    response = stream(gateway, sent)
    assert sim.app.captured("/v1/chat/completions")[-1].body == sent
    assert '"choices":[],"usage":' in response.text
    usage = completion_record(tmp_path / "log", response.headers["x-request-id"])["usage"]
    assert usage["completion_tokens"] == 4


def test_a_backend_that_reports_no_usage_is_charged_an_estimate(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    chunk = b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"word "}}]}\n\n'  # noqa: E501

    async def no_usage(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head() + chunk * 10 + b"data: [DONE]\n\n")
        await writer.drain()
        return False

    raw = start_raw(no_usage)
    gateway = start_gateway([backend("gpu", raw.url, "m")], tenants=tenants(tokens_per_minute=100))
    # ~1 KB relayed and ~100 B of prompt: ~280 tokens estimated, not 0.
    assert statuses_until_refused(gateway, body(), most=3) == [200, 429]


@pytest.mark.filterwarnings(  # LiteLLM's own, while streaming (see test_hosted.py)
    "ignore:Item '[A-Za-z_]+' on TypedDict class '[A-Za-z_]+' is using the `ReadOnly` "
    "qualifier:UserWarning",
    "ignore:Accessing the '[a-z_]+' attribute on the instance is deprecated"
    ":pydantic.warnings.PydanticDeprecatedSince211",
)
def test_a_hosted_stream_without_include_usage_is_charged_too(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    provider = start_sim("vllm", models=("m",), zero_latency=True)
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", f"{provider.url}/v1", "m")],
        tenants=tenants(tokens_per_minute=600),
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
    )
    statuses = statuses_until_refused(gateway, body(max_tokens=200), most=8)
    # LiteLLM's counts of the simulator's text differ a little from the simulator's own.
    assert statuses[-1] == 429 and len(statuses) <= 5
