"""Which whole hosted answers `unfinished` (gateway/upstream/hosted_finish.py) reads as left
without the provider's finish reason, table-driven: OpenAI's wire and Anthropic's are
judged; any other shape, or no answer kept, is not (LiteLLM's "stop" stands there)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.hosted_finish import unfinished


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def choices(*reasons: Any) -> bytes:
    return body({"choices": [{"index": i, **r} for i, r in enumerate(reasons)]})


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (choices({"finish_reason": "stop"}), False),
        (choices({"finish_reason": "length"}, {"finish_reason": "tool_calls"}), False),
        (choices({"finish_details": {"type": "stop"}}), False),  # legacy, as LiteLLM reads
        (choices({"finish_reason": None}), True),
        (choices({}), True),
        (choices({"finish_reason": "stop"}, {"finish_reason": None}), True),
        (body({"choices": ["not an object"]}), True),
        (body({"type": "message", "content": [], "stop_reason": "end_turn"}), False),
        (body({"type": "message", "content": [], "stop_reason": None}), True),
        (body({"type": "message", "content": []}), True),
        (body({"candidates": [{"content": {}}]}), False),  # Gemini: not judged
        (body({"object": "response", "output": []}), False),  # Responses API: not judged
        (body({"choices": []}), False),  # no choice to judge
        (body([1, 2]), False),
        (b"not json", False),
        (b"", False),
        (None, False),
    ],
)
def test_unfinished(answer: bytes | None, expected: bool) -> None:
    assert unfinished(answer) is expected
