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

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.gateways import LITELLM_WARNINGS, Gateway
from tests.helpers.hosted_answers import anthropic_answer, ask, openai_answer
from tests.helpers.raw_backend import Answer, RawBackend

pytestmark = LITELLM_WARNINGS


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
        (openai_answer({"finish_reason": "tool_calls"}), False, "tool_calls"),
        (openai_answer({"finish_reason": "content_filter"}), False, "content_filter"),
        (anthropic_answer("max_tokens"), True, "length"),
    ],
    ids=["stop", "length", "tool-calls", "content-filter", "anthropic-max-tokens"],
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
