"""Which whole hosted answers `unfinished` (gateway/upstream/hosted_finish.py) reads as left
without the provider's finish reason, table-driven: OpenAI's wire and Anthropic's are
judged, and Gemini's, Bedrock Converse's, a Responses API answer's (by its `status`) and
Cohere's (on a Cohere route only); any other shape, or no answer kept, is not (LiteLLM's
"stop" stands there); and
which `short_of` reads as holding fewer or other choices than asked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.anthropic_stops import relabeled
from gateway.upstream.hosted_finish import relabel, short_of, unfinished


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def responses(status: str, reason: str | None = None) -> bytes:
    """A Responses API answer in `status`, incomplete for `reason` (none when None)."""
    details = None if reason is None else {"reason": reason}
    return body({"object": "response", "status": status, "incomplete_details": details})


def gemini(*reasons: str | None) -> bytes:
    candidates: list[dict[str, Any]] = [
        {"content": {}, "index": i, "finishReason": r} for i, r in enumerate(reasons)
    ]
    return body({"candidates": candidates})


def converse(reason: str | None) -> bytes:
    return body({"output": {"message": {"role": "assistant", "content": []}}, "stopReason": reason})


def choices(*reasons: Any) -> bytes:
    return body({"choices": [{"index": i, **r} for i, r in enumerate(reasons)]})


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (choices({"finish_reason": "stop"}), False),
        (choices({"finish_reason": "length"}, {"finish_reason": "tool_calls"}), False),
        (choices({"finish_details": {"type": "stop"}}), False),  # legacy, as LiteLLM reads
        (choices({"finish_reason": "content_filter"}), False),
        (choices({"finish_reason": "model_length"}), False),  # Mistral's: relayed as length
        (choices({"finish_reason": "eos"}), False),  # Together AI's
        # LiteLLM's "stop" (its `map_finish_reason`), each a failure or unknown:
        (choices({"finish_reason": "error"}), True),  # OpenRouter's: failed mid-answer
        (choices({"finish_reason": "abort"}), True),  # vLLM's: the request was aborted
        (choices({"finish_reason": "network_error"}), True),  # Zhipu's
        (choices({"finish_reason": "insufficient_system_resource"}), True),  # DeepSeek's
        (choices({"finish_reason": "a_reason_from_next_year"}), True),
        (choices({"finish_reason": "stop"}, {"finish_reason": "abort"}), True),
        (choices({"finish_details": {"type": "abort"}}), True),
        (choices({"finish_reason": None}), True),
        (choices({}), True),
        (choices({"finish_reason": "stop"}, {"finish_reason": None}), True),
        (body({"choices": ["not an object"]}), True),
        (body({"type": "message", "content": [], "stop_reason": "end_turn"}), False),
        (body({"type": "message", "content": [], "stop_reason": None}), True),
        (body({"type": "message", "content": []}), True),
        (body({"type": "message", "content": [], "stop_reason": "pause_turn"}), True),
        (body({"type": "message", "content": [], "stop_reason": "next_years"}), True),
        (body({"type": "message", "content": [], "stop_reason": "tool_use"}), False),
        (body({"type": "message", "content": [], "stop_reason": "refusal"}), False),
        (body({"type": "message", "content": [], "stop_reason": "stop_sequence"}), False),
        (body({"type": "message", "content": [], "stop_reason": "max_tokens"}), False),
        (
            body(
                {"type": "message", "content": [], "stop_reason": "model_context_window_exceeded"}
            ),
            False,
        ),
        (gemini("STOP"), False),
        (gemini("MAX_TOKENS"), False),
        (gemini("SAFETY"), False),
        (gemini(None), True),  # LiteLLM's "stop" for none
        (body({"candidates": [{"content": {}}]}), True),
        (gemini("MALFORMED_FUNCTION_CALL"), True),  # LiteLLM's "stop"
        (gemini("FINISH_REASON_UNSPECIFIED"), True),
        (gemini("A_REASON_FROM_NEXT_YEAR"), True),
        (gemini("STOP", None), True),
        (body({"candidates": [], "promptFeedback": {"blockReason": "SAFETY"}}), False),
        (converse("end_turn"), False),
        (converse("tool_use"), False),
        (converse("guardrail_intervened"), False),
        (converse("model_context_window_exceeded"), False),  # relayed as length
        (converse(None), True),
        (converse("a_reason_from_next_year"), True),
        (body({"finish_reason": "ERROR", "message": {}}), False),  # Cohere's, off its route
        (body({"object": "response", "output": []}), True),  # a Responses API's: no status
        (responses("completed"), False),
        (responses("incomplete", "max_output_tokens"), False),  # relayed as length
        (responses("incomplete", "content_filter"), False),
        (responses("incomplete"), True),  # LiteLLM's "length" for no reason stated
        (responses("incomplete", "a_reason_from_next_year"), True),
        (responses("failed"), True),  # LiteLLM's "stop"
        (responses("cancelled"), True),
        (responses("in_progress"), True),
        (responses("queued"), True),
        # Both shapes in one answer: judged as both (a finished status does not pass a
        # choice without a finish reason, nor finished choices a failed status).
        (
            body({"object": "response", "status": "completed", "choices": [{"index": 0}]}),
            True,
        ),
        (
            body(
                {
                    "object": "response",
                    "status": "failed",
                    "choices": [{"index": 0, "finish_reason": "stop"}],
                }
            ),
            True,
        ),
        (
            body(
                {
                    "object": "response",
                    "status": "completed",
                    "choices": [{"index": 0, "finish_reason": "stop"}],
                }
            ),
            False,
        ),
        (body({"choices": []}), False),  # no choice to judge
        (body([1, 2]), False),
        (b"not json", False),
        (b"", False),
        (None, False),
    ],
)
def test_unfinished(answer: bytes | None, expected: bool) -> None:
    assert (unfinished(answer) is not None) is expected


@pytest.mark.parametrize("route", ["cohere", "cohere_chat"])
@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("COMPLETE", None),
        ("STOP_SEQUENCE", None),
        ("MAX_TOKENS", "length"),
        ("ERROR_LIMIT", "length"),
        ("TOOL_CALL", "tool_calls"),
        ("ERROR_TOXIC", "content_filter"),
        ("ERROR", "unfinished"),  # LiteLLM's "stop", as for every whole Cohere answer
        ("TIMEOUT", "unfinished"),
        ("USER_CANCEL", "unfinished"),
        ("A_REASON_FROM_NEXT_YEAR", "unfinished"),
        (None, "unfinished"),
    ],
)
def test_a_cohere_answer_is_judged_and_relabeled_on_its_route(
    route: str, reason: str | None, expected: str | None
) -> None:
    answer = body({"id": "c", "message": {}, "finish_reason": reason})
    assert (unfinished(answer, route) is not None) is (expected == "unfinished")
    if expected in (None, "unfinished"):
        return
    result = _Answer("stop")  # LiteLLM's, whatever Cohere said
    relabel(result, answer, route)
    assert result.choices[0].finish_reason == expected


def test_a_paused_turn_is_named_and_no_other_reason_of_the_provider_is() -> None:
    paused = body({"type": "message", "content": [], "stop_reason": "pause_turn"})
    assert unfinished(paused) == "paused its turn (pause_turn: unfinished)"
    made_up = body({"type": "message", "content": [], "stop_reason": "CANARY-7f3"})
    assert "CANARY" not in (unfinished(made_up) or "CANARY")
    assert "CANARY" not in (unfinished(gemini("CANARY-7f3")) or "CANARY")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            body(
                {"type": "message", "content": [], "stop_reason": "model_context_window_exceeded"}
            ),
            "length",
        ),
        (converse("model_context_window_exceeded"), "length"),
        (converse("end_turn"), None),
        (body({"type": "message", "content": [], "stop_reason": "max_tokens"}), None),
        (None, None),
    ],
)
def test_relabeled(answer: bytes | None, reason: str | None) -> None:
    assert relabeled(answer) == reason


class _Choice:
    def __init__(self, finish_reason: str) -> None:
        self.finish_reason = finish_reason


class _Answer:
    def __init__(self, *reasons: str) -> None:
        self.choices = [_Choice(r) for r in reasons]


@pytest.mark.parametrize(
    ("raw", "litellm", "relayed"),
    [
        # Mistral's `model_length`: the context window ended the answer (LiteLLM: "stop").
        ([{"finish_reason": "model_length"}], ["stop"], ["length"]),
        (
            [{"finish_reason": "stop"}, {"finish_reason": "model_length"}],
            ["stop", "stop"],
            ["stop", "length"],
        ),
        ([{"finish_reason": "stop"}], ["stop"], ["stop"]),
        ([{"finish_reason": "tool_calls"}], ["tool_calls"], ["tool_calls"]),
    ],
)
def test_relabel_gives_each_choice_its_providers_reason(
    raw: list[dict[str, Any]], litellm: list[str], relayed: list[str]
) -> None:
    result = _Answer(*litellm)
    relabel(result, choices(*raw))
    assert [c.finish_reason for c in result.choices] == relayed


@pytest.mark.parametrize(
    ("endpoint", "params", "body_items", "raw", "short"),
    [
        ("chat", {"n": 2}, [0, 1], None, False),
        ("chat", {"n": 2}, [1, 0], None, False),
        ("chat", {}, [0], None, False),
        ("chat", {"n": 2}, [0], None, True),
        ("chat", {}, [0, 1], None, True),
        ("chat", {"n": 2}, [0, 0], None, True),
        ("chat", {"n": 2}, [0, 1], [0, 2], True),  # LiteLLM renumbered the provider's
        ("chat", {"n": 2}, [0, 1], [0, 0], True),
        ("chat", {"n": 2}, [0, 1], [None, None], False),  # unnumbered: numbered by place
        ("completions", {"prompt": ["a", "b"], "n": 2}, [0, 1, 2, 3], None, False),
        ("completions", {"prompt": ["a", "b"]}, [0], None, True),
        ("completions", {"prompt": [1, 2, 3]}, [0], None, False),  # one token array
        ("embeddings", {"input": [[1], [2]]}, [0, 1], None, False),
        ("embeddings", {"input": ["a", "b", "c"]}, [0, 1], None, True),
    ],
)
def test_short_of(
    endpoint: str,
    params: dict[str, Any],
    body_items: list[int],
    raw: list[int | None] | None,
    short: bool,
) -> None:
    key = "data" if endpoint == "embeddings" else "choices"
    sent = body({key: [{"index": i} for i in body_items]})
    own = None
    if raw is not None:
        own = body({key: [{} if i is None else {"index": i} for i in raw]})
    assert (short_of(endpoint, params, sent, own) is not None) is short
