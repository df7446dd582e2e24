"""An embeddings request's `encoding_format: "base64"` gets base64 from every hosted
adapter (gateway/upstream/openai_wire.py `base64_embedding`).

LiteLLM 1.108.7's Gemini (and Vertex AI) embeddings adapter has no such option and drops
it without a word: a client that asked for base64 (the OpenAI SDKs ask for it unless told
otherwise) got lists of floats, and the completion record committed to them. The gateway
now writes such vectors as OpenAI does (little-endian float32, base64); a provider that
answered base64 itself is relayed as it answered. A scripted Gemini answers on a real
socket.
"""

from __future__ import annotations

import array
import asyncio
import base64
import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError
from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.raw_backend import Answer, RawBackend, json_answer

pytestmark = LITELLM_WARNINGS

VECTORS = [[0.5, -1.25, 3.0], [0.1, 0.2, 0.3]]


def embedded(
    start_raw: Callable[[Answer], RawBackend], vectors: list[list[Any]], encoding: str | None
) -> list[Any]:
    """The `embedding` of each item a `HostedClient` for Gemini relays, for `vectors`
    answered to a request with `encoding_format` `encoding` (none when None)."""
    answer = {"embeddings": [{"values": v} for v in vectors]}
    provider = start_raw(json_answer(json.dumps(answer).encode()))
    backend = BackendSettings.model_validate(
        {
            "id": "g",
            "kind": "hosted",
            "provider": "gemini",
            "base_url": provider.url,
            "models": [{"name": "m", "provider_model": "gemini/text-embedding-004"}],
            "region": "eu",
            "owner": "google",
            "api_key_env": "KEY",
        }
    )
    client = HostedClient(backend, environ={"KEY": "k"}, timeout_s=10, max_answer_bytes=1 << 20)
    doc: dict[str, Any] = {"model": "m", "input": ["a", "b"]}
    if encoding is not None:
        doc["encoding_format"] = encoding

    async def send() -> list[Any]:
        try:
            response = await client.send("embeddings", doc, "m")
            return [item["embedding"] for item in json.loads(response.body or b"{}")["data"]]
        finally:
            await client.aclose()

    return asyncio.run(send())


def decoded(text: str) -> list[float]:
    """What the OpenAI SDK reads of a base64 embedding (float32, little-endian)."""
    floats = array.array("f", base64.b64decode(text))
    return floats.tolist()


def test_base64_asked_of_gemini_is_base64(start_raw: Callable[[Answer], RawBackend]) -> None:
    relayed = embedded(start_raw, VECTORS, "base64")
    # Before: `[0.5, -1.25, 3.0]`, a list where base64 was asked.
    assert all(isinstance(e, str) for e in relayed), relayed
    assert [decoded(e) for e in relayed] == [array.array("f", v).tolist() for v in VECTORS]


@pytest.mark.parametrize("encoding", ["float", None])
def test_floats_asked_of_gemini_are_floats(
    start_raw: Callable[[Answer], RawBackend], encoding: str | None
) -> None:
    assert embedded(start_raw, VECTORS, encoding) == VECTORS


def test_a_vector_past_float32_is_a_protocol_failure_not_an_infinity(
    start_raw: Callable[[Answer], RawBackend],
) -> None:
    with pytest.raises(HostedError) as failed:
        embedded(start_raw, [[1e39, 0.0], [0.0, 0.0]], "base64")
    assert failed.value.kind == "protocol"


@pytest.mark.parametrize("encoding", ["float", None, "base64"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_vector_holding_nan_or_infinity_is_a_protocol_failure_not_null(
    start_raw: Callable[[Answer], RawBackend], encoding: str | None, bad: float
) -> None:
    # `NaN` and `Infinity` are not JSON, but LiteLLM's parser reads them. Before: the
    # float answer was relayed (and committed to) as `[null, 0.0]`.
    with pytest.raises(HostedError) as failed:
        embedded(start_raw, [[bad, 0.0], [0.0, 0.0]], encoding)
    assert failed.value.kind == "protocol"
