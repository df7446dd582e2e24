"""A real instruct model behind owngate: SmolLM2-135M-Instruct (F16) on a real
llama.cpp `llama-server` answers a known question correctly through the gateway.

The prebuilt server's quantized kernels answer nonsense on some CPUs, and a one-token
probe cannot tell; these tests check the words that come back, non-streamed and
streamed, after the gateway's routing, authentication and relay.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from tests.helpers.gateways import Gateway, backend
from tests.helpers.prerequisites import real_backend, real_smollm2
from tests.helpers.real_backend.server import (
    KNOWN_ANSWER,
    KNOWN_QUESTION,
    LlamaServer,
    ask,
    probe,
    probe_answer,
)

pytestmark = pytest.mark.real_backend


@pytest.fixture
def gateway(real_smollm2_server: LlamaServer, start_gateway: Callable[..., Gateway]) -> Gateway:
    entry = {"name": real_smollm2_server.alias, "aliases": ["assistant"]}
    return start_gateway(
        [backend("cpu-smollm2", real_smollm2_server.base_url, entry, kind="llamacpp")]
    )


def test_the_model_answers_paris_through_the_gateway(gateway: Gateway) -> None:
    reply = ask(
        gateway.url, KNOWN_QUESTION, timeout_s=60.0, headers=gateway.headers, model="assistant"
    )
    assert KNOWN_ANSWER in reply


def test_the_streamed_answer_says_paris_through_the_gateway(gateway: Gateway) -> None:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": KNOWN_QUESTION}],
        "temperature": 0,
        "max_tokens": 20,
        "stream": True,
    }
    parts: list[str] = []
    with (
        httpx.Client(trust_env=False, timeout=60.0) as client,
        client.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers
        ) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or [{}]
                parts.append(choices[0].get("delta", {}).get("content") or "")
    assert len([p for p in parts if p]) > 1  # really streamed, token by token
    assert KNOWN_ANSWER in "".join(parts)


def test_the_answer_probe_rejects_a_model_that_serves_but_answers_wrongly(
    tmp_path: Path,
) -> None:
    # The random-weight tiny model serves (the one-token probe passes) but knows nothing.
    installation = real_backend()
    problem = probe_answer(installation.server_binary, installation.tiny_model, log_dir=tmp_path)
    assert problem is not None and problem.startswith(f"asked {KNOWN_QUESTION!r}")
    assert probe(installation.server_binary, installation.tiny_model, log_dir=tmp_path) is None


def test_the_exported_tokenizer_matches_the_servers(real_smollm2_server: LlamaServer) -> None:
    installation = real_smollm2()
    assert installation.smollm2_tokenizer_dir is not None
    tokenizer = Tokenizer.from_file(str(installation.smollm2_tokenizer_dir / "tokenizer.json"))
    text = "What is the capital of France? Ünïcödé, naïve café — 1234 tokens\n\tend"
    with httpx.Client(trust_env=False, timeout=30.0) as client:
        response = client.post(f"{real_smollm2_server.base_url}/tokenize", json={"content": text})
    assert response.status_code == 200
    assert tokenizer.encode(text).ids == response.json()["tokens"]
