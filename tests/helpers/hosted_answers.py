"""One hosted answer, scripted byte for byte, through a gateway with its provenance log
on: what the client got and what the request's completion record says (`ask`).

The provider is a raw backend (tests/helpers/raw_backend.py) that answers every request
with `body`: an OpenAI-shaped one (`openai_answer`) behind LiteLLM's OpenAI adapter, or
an Anthropic Messages one (`anthropic_answer`) behind its Anthropic adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import httpx

from tests.helpers.gateways import Gateway, anthropic_backend, hosted_backend
from tests.helpers.log_truth import logged_hosted_gateway
from tests.helpers.provenance import request_records
from tests.helpers.raw_backend import Answer, RawBackend, json_answer

__all__ = ["ASK", "MESSAGE", "anthropic_answer", "ask", "openai_answer"]

ORIGIN: Final = "test.owngate/hosted-answers"
ASK: Final = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
MESSAGE: Final = {"role": "assistant", "content": "half an ans"}


def openai_answer(*choices: dict[str, Any], indices: list[int] | None = None) -> bytes:
    """A chat completion of `choices`, numbered 0, 1, ... unless `indices` says otherwise."""
    numbers = indices if indices is not None else list(range(len(choices)))
    numbered = [
        {"index": i, "message": MESSAGE, **c} for i, c in zip(numbers, choices, strict=True)
    ]
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


def anthropic_answer(stop_reason: str | None, content: list[dict[str, Any]] | None = None) -> bytes:
    return json.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-mock-1",
            "content": content or [{"type": "text", "text": "half an ans"}],
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
    doc: dict[str, Any] = ASK,
    path: str = "/v1/chat/completions",
    record: str = "completion",
) -> tuple[httpx.Response, dict[str, Any]]:
    """What the client got for `doc` (at `path`) when the provider answers `body`, and
    the request's record of type `record` (one, its only)."""
    provider = start_raw(json_answer(body))
    if anthropic:
        backend = anthropic_backend("hosted", provider.url)
    else:
        backend = hosted_backend("hosted", f"{provider.url}/v1", "m")
    environ = {"HOSTED_KEY": "sk-test", "MOCK_ANTHROPIC_KEY": "sk-ant-test"}
    gateway = logged_hosted_gateway(start_gateway, tmp_path, backend, environ, ORIGIN)
    response = httpx.post(f"{gateway.url}{path}", json=doc, headers=gateway.headers, timeout=60)
    request_id = response.headers["x-request-id"]
    (found,) = request_records(tmp_path / "log", request_id, record)
    return response, found
