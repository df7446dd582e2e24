"""A whole hosted answer whose provider gave no finish reason is not relayed as finished
(gateway/upstream/hosted_finish.py).

LiteLLM 1.108.7 writes `"stop"` into a choice whose provider gave `finish_reason: null`
(or none), and Anthropic's `stop_reason: null` the same way: the client got a 200 whose
bytes claimed a finish the provider never gave, and the completion record committed to
them. Now such an answer is the provider's failure, as a stream's end without a finish
reason is: 502 `upstream_error`, and the completion record says 502 and commits to
nothing. An answer with the provider's own reason (`stop`, `length`) is served as it was.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError
from gateway.upstream.hosted_finish import Unfinished
from tests.helpers.gateways import LITELLM_WARNINGS, Gateway
from tests.helpers.hosted_answers import anthropic_answer, ask, openai_answer
from tests.helpers.raw_backend import Answer, RawBackend, json_answer

pytestmark = LITELLM_WARNINGS


@pytest.mark.parametrize(
    ("body", "anthropic"),
    [
        (openai_answer({"finish_reason": None}), False),
        (openai_answer({}), False),  # no finish_reason at all
        (openai_answer({"finish_reason": "stop"}, {"finish_reason": None}), False),  # n: 2
        (anthropic_answer(None), True),
        # Each LiteLLM's "stop" (`map_finish_reason`), each a failure or unknown:
        (openai_answer({"finish_reason": "error"}), False),
        (openai_answer({"finish_reason": "abort"}), False),
        (openai_answer({"finish_reason": "network_error"}), False),
        (openai_answer({"finish_reason": "a_reason_from_next_year"}), False),
    ],
    ids=["null", "missing", "one-of-two", "anthropic-null", "error", "abort", "network", "new"],
)
def test_an_answer_without_the_providers_finish_reason_is_not_relayed_as_finished(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    body: bytes,
    anthropic: bool,
) -> None:
    response, completion = ask(start_raw, start_gateway, tmp_path, body, anthropic)
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "upstream_error"
    assert b"half an ans" not in response.content
    assert completion["status"] == 502
    assert completion["response_commitment"] is None


@pytest.mark.parametrize(
    ("body", "anthropic", "reason"),
    [
        (openai_answer({"finish_reason": "stop"}), False, "stop"),
        (openai_answer({"finish_reason": "length"}), False, "length"),
        (openai_answer({"finish_reason": "tool_calls"}), False, "tool_calls"),
        (openai_answer({"finish_reason": "content_filter"}), False, "content_filter"),
        (anthropic_answer("max_tokens"), True, "length"),
        (openai_answer({"finish_reason": "model_length"}), False, "length"),  # before: "stop"
    ],
    ids=["stop", "length", "tool-calls", "content-filter", "anthropic-max-tokens", "mistral"],
)
def test_an_answer_with_the_providers_finish_reason_is_served(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    body: bytes,
    anthropic: bool,
    reason: str,
) -> None:
    response, completion = ask(start_raw, start_gateway, tmp_path, body, anthropic)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] == reason
    assert completion["status"] == 200


def gemini_answer(finish_reason: str | None) -> bytes:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": "half"}]}}
    if finish_reason is not None:
        candidate["finishReason"] = finish_reason
    usage = {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}
    return json.dumps({"candidates": [candidate], "usageMetadata": usage}).encode()


@pytest.mark.parametrize(
    ("finish_reason", "relayed"),
    [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        (None, None),
        ("MALFORMED_FUNCTION_CALL", None),
    ],
)
def test_a_gemini_answer_is_relayed_as_finished_only_for_a_reason_that_ends_it(
    start_raw: Callable[[Answer], RawBackend], finish_reason: str | None, relayed: str | None
) -> None:
    # LiteLLM relays Gemini's missing `finishReason`, and `MALFORMED_FUNCTION_CALL`, as
    # "stop": a complete answer (gateway/upstream/hosted_finish.py).
    provider = start_raw(json_answer(gemini_answer(finish_reason)))
    backend = BackendSettings.model_validate(
        {
            "id": "g",
            "kind": "hosted",
            "provider": "gemini",
            "base_url": provider.url,
            "models": [{"name": "m", "provider_model": "gemini/gemini-2.0-flash"}],
            "region": "eu",
            "owner": "google",
            "api_key_env": "KEY",
        }
    )
    client = HostedClient(backend, environ={"KEY": "k"}, timeout_s=10, max_answer_bytes=1 << 20)
    doc = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def send() -> str:
        try:
            response = await client.send("chat", doc, "m")
            return str(json.loads(response.body or b"{}")["choices"][0]["finish_reason"])
        finally:
            await client.aclose()

    if relayed is not None:
        assert asyncio.run(send()) == relayed
        return
    with pytest.raises(HostedError) as refused:  # before: "stop", a 200
        asyncio.run(send())
    assert (refused.value.kind, type(refused.value)) == ("protocol", Unfinished)
