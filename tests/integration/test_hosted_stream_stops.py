"""A hosted stream is relayed as finished only for a finish reason of its provider's that
ends it, on OpenAI's wire, Gemini's and Bedrock Converse's (gateway/upstream/stream_stops.py,
the reasons in gateway/upstream/finish_reasons.py).

LiteLLM 1.108.7 relayed each of these with `"finish_reason": "stop"` and `[DONE]`: an
OpenAI-compatible server's `abort`, `network_error` or unknown reason, Mistral's
`model_length` (a `length`), any such stream that ended with `data: [DONE]` and no
reason at all (LiteLLM's own parser made up the `"stop"`), a Gemini stream without a
`finishReason` or with `MALFORMED_FUNCTION_CALL`, a Converse stream with a `stopReason`
it does not know. Now such a stream ends with the gateway's error (no `[DONE]`); what
the client and its record then see is tests/integration/test_hosted_anthropic_stops.py's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.hosted_streams import (
    AWS_ENVIRON,
    BEDROCK_MODEL,
    converse_events,
    converse_stream,
    gemini_events,
    openai_events,
    relayed,
    sse_stream,
    text_events,
)
from tests.helpers.raw_backend import Answer, RawBackend

pytestmark = LITELLM_WARNINGS

# An OpenAI-SDK route (`openai/`) and two LiteLLM parses itself (Mistral's, vLLM's).
OPENAI_ROUTES = [
    ("openai", "openai/m"),
    ("mistral", "mistral/mistral-small-latest"),
    ("openai", "hosted_vllm/m"),
]
GEMINI = ("gemini", "gemini/gemini-2.0-flash")


def finish_of(events: list[bytes]) -> str | None:
    """The finish reason the relayed stream ended with; None when it has none."""
    for event in events:
        for reason in (b"stop", b"length", b"tool_calls", b"content_filter"):
            if b'"finish_reason":"' + reason + b'"' in event:
                return reason.decode()
    return None


def broken_off(events: list[bytes], failure: object) -> bool:
    """Whether the stream ended with the gateway's failure: no finish reason, no [DONE]."""
    return failure is not None and finish_of(events) is None and b"[DONE]" not in b"".join(events)


@pytest.mark.parametrize(("provider", "model"), OPENAI_ROUTES)
@pytest.mark.parametrize(
    "reason", ["abort", "network_error", "insufficient_system_resource", "a_reason_from_next_year"]
)
def test_an_openai_wire_stream_that_ended_for_no_finish_is_broken_off(
    start_raw: Callable[[Answer], RawBackend], provider: str, model: str, reason: str
) -> None:
    events, failure = relayed(start_raw, sse_stream(openai_events(reason)), provider, model)
    # Before: `"finish_reason":"stop"` and `[DONE]`.
    assert broken_off(events, failure), (events, failure)
    assert failure is not None and failure.kind == "protocol"


@pytest.mark.parametrize(("provider", "model"), OPENAI_ROUTES)
def test_an_openai_wire_stream_without_a_finish_reason_is_broken_off_at_done(
    start_raw: Callable[[Answer], RawBackend], provider: str, model: str
) -> None:
    # `data: [DONE]` after a chunk whose `finish_reason` is null: before, LiteLLM's own
    # parser (all but `openai/`) made a "stop" of the `[DONE]`.
    events, failure = relayed(start_raw, sse_stream(openai_events(None)), provider, model)
    assert broken_off(events, failure), (events, failure)


@pytest.mark.parametrize(("provider", "model"), OPENAI_ROUTES)
@pytest.mark.parametrize(
    ("reason", "finish"),
    [("stop", "stop"), ("length", "length"), ("model_length", "length"), ("eos", "stop")],
)
def test_an_openai_wire_stream_that_finished_ends_with_its_reason(
    start_raw: Callable[[Answer], RawBackend], provider: str, model: str, reason: str, finish: str
) -> None:
    events, failure = relayed(start_raw, sse_stream(openai_events(reason)), provider, model)
    assert failure is None, failure
    assert finish_of(events) == finish  # `model_length` before: "stop"
    assert events[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("reason", "finish"),
    [("abort", None), (None, None), ("model_length", "length"), ("stop", "stop")],
)
def test_a_text_completion_stream_ends_with_its_providers_reason_or_is_broken_off(
    start_raw: Callable[[Answer], RawBackend], reason: str | None, finish: str | None
) -> None:
    # LiteLLM hides the stream wrapper of a text completion on `/completions` in a
    # generator: its made-up last chunk ("stop") was relayed, `[DONE]` and all, for a
    # stream that ended without a finish reason, or for `abort`.
    doc = {"model": "m", "prompt": "hi", "stream": True}
    answer = sse_stream(text_events(reason))
    events, failure = relayed(start_raw, answer, "openai", "openai/m", doc, "completions")
    if finish is None:
        assert broken_off(events, failure), (events, failure)
        return
    assert failure is None, failure
    assert finish_of(events) == finish
    assert events[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    "reason",
    [None, "MALFORMED_FUNCTION_CALL", "FINISH_REASON_UNSPECIFIED", "A_REASON_FROM_NEXT_YEAR"],
)
def test_a_gemini_stream_that_did_not_finish_is_broken_off(
    start_raw: Callable[[Answer], RawBackend], reason: str | None
) -> None:
    events, failure = relayed(start_raw, sse_stream(gemini_events(reason), done=False), *GEMINI)
    # Before: every chunk of Gemini's was LiteLLM's "stop"; relayed with `[DONE]`.
    assert broken_off(events, failure), (events, failure)
    assert b"half an" in b"".join(events)  # what came was relayed


@pytest.mark.parametrize(
    ("reason", "finish"), [("STOP", "stop"), ("MAX_TOKENS", "length"), ("SAFETY", "content_filter")]
)
def test_a_gemini_stream_that_finished_ends_with_its_reason(
    start_raw: Callable[[Answer], RawBackend], reason: str, finish: str
) -> None:
    events, failure = relayed(start_raw, sse_stream(gemini_events(reason), done=False), *GEMINI)
    assert failure is None, failure
    assert finish_of(events) == finish
    assert events[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize("reason", [None, "malformed_model_output", "a_reason_from_next_year"])
def test_a_converse_stream_that_did_not_finish_is_broken_off(
    start_raw: Callable[[Answer], RawBackend],
    monkeypatch: pytest.MonkeyPatch,
    reason: str | None,
) -> None:
    for name, value in AWS_ENVIRON.items():
        monkeypatch.setenv(name, value)
    answer = converse_stream(converse_events(reason))
    events, failure = relayed(start_raw, answer, "aws", BEDROCK_MODEL)
    # Before: an unknown `stopReason` was LiteLLM's "stop", relayed with `[DONE]`.
    assert broken_off(events, failure), (events, failure)


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("guardrail_intervened", "content_filter"),
        ("model_context_window_exceeded", "length"),  # before: "stop"
    ],
)
def test_a_converse_stream_that_finished_ends_with_its_reason(
    start_raw: Callable[[Answer], RawBackend],
    monkeypatch: pytest.MonkeyPatch,
    reason: str,
    finish: str,
) -> None:
    for name, value in AWS_ENVIRON.items():
        monkeypatch.setenv(name, value)
    answer = converse_stream(converse_events(reason))
    events, failure = relayed(start_raw, answer, "aws", BEDROCK_MODEL)
    assert failure is None, failure
    assert finish_of(events) == finish
    assert events[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("reason", "finish"), [("STOP", "stop"), ("MAX_TOKENS", "length"), (None, None)]
)
def test_a_gemini_stream_with_usage_after_its_finish_keeps_the_finish(
    start_raw: Callable[[Answer], RawBackend], reason: str | None, finish: str | None
) -> None:
    # The finish chunk, then a chunk of usage only (no candidates). Before: that chunk
    # cleared LiteLLM's remembered finish reason, so a finished stream was broken off.
    usage = {"promptTokenCount": 1, "candidatesTokenCount": 2, "totalTokenCount": 3}
    script = [*gemini_events(reason), {"usageMetadata": usage}]
    events, failure = relayed(start_raw, sse_stream(script, done=False), *GEMINI)
    if finish is None:  # no finish reason at all: still broken off, none made up
        assert broken_off(events, failure), (events, failure)
        return
    assert failure is None, (events, failure)
    assert finish_of(events) == finish
    assert events[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize(("provider", "model"), OPENAI_ROUTES)
@pytest.mark.parametrize(
    ("reason", "finish"), [("stop", "stop"), ("length", "length"), (None, None)]
)
def test_an_openai_wire_stream_with_usage_after_its_finish_keeps_the_finish(
    start_raw: Callable[[Answer], RawBackend],
    provider: str,
    model: str,
    reason: str | None,
    finish: str | None,
) -> None:
    # What OpenAI sends for `stream_options.include_usage`: the finish chunk, then a
    # chunk of usage and no choices.
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    script = [*openai_events(reason), {**openai_events(None)[0], "choices": [], "usage": usage}]
    doc = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events, failure = relayed(start_raw, sse_stream(script), provider, model, doc)
    if finish is None:
        assert broken_off(events, failure), (events, failure)
        return
    assert failure is None, (events, failure)
    assert finish_of(events) == finish
    assert b'"total_tokens":3' in b"".join(events)  # the usage is relayed too
    assert events[-1] == b"data: [DONE]\n\n"
