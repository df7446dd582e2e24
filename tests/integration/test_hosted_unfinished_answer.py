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

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import write_signing_key
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    anthropic_backend,
    hosted_backend,
)
from tests.helpers.provenance import request_records
from tests.helpers.raw_backend import Answer, RawBackend, json_answer

pytestmark = LITELLM_WARNINGS

ORIGIN = "test.owngate/unfinished"
ASK = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
MESSAGE = {"role": "assistant", "content": "half an ans"}


def openai_answer(*choices: dict[str, Any]) -> bytes:
    numbered = [{"index": i, "message": MESSAGE, **c} for i, c in enumerate(choices)]
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": numbered,
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        }
    ).encode()


def anthropic_answer(stop_reason: str | None) -> bytes:
    return json.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-mock-1",
            "content": [{"type": "text", "text": "half an ans"}],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 3},
        }
    ).encode()


def ask(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    body: bytes,
    anthropic: bool = False,
) -> tuple[httpx.Response, dict[str, Any]]:
    """What the client got for `body` from the provider, and the request's completion."""
    provider = start_raw(json_answer(body))
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    if anthropic:
        backend = anthropic_backend("hosted", provider.url)
    else:
        backend = hosted_backend("hosted", f"{provider.url}/v1", "m")
    gateway = start_gateway(
        [backend],
        environ={"HOSTED_KEY": "sk-test", "MOCK_ANTHROPIC_KEY": "sk-ant-test"},
        policy={"paths": [str(tmp_path / "policies")]},
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": ORIGIN,
            "signing_key_file": str(tmp_path / "log.key"),
            "checkpoint_interval_ms": 20,
        },
    )
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ASK, headers=gateway.headers, timeout=60
    )
    request_id = response.headers["x-request-id"]
    (completion,) = request_records(tmp_path / "log", request_id, "completion")
    return response, completion


@pytest.mark.parametrize(
    ("body", "anthropic"),
    [
        (openai_answer({"finish_reason": None}), False),
        (openai_answer({}), False),  # no finish_reason at all
        (openai_answer({"finish_reason": "stop"}, {"finish_reason": None}), False),  # n: 2
        (anthropic_answer(None), True),
    ],
    ids=["null", "missing", "one-of-two", "anthropic-null"],
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
        (anthropic_answer("max_tokens"), True, "length"),
    ],
    ids=["stop", "length", "anthropic-max-tokens"],
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
