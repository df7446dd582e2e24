"""The finish reasons a hosted provider gives in OpenAI's wire format, Gemini's and Bedrock
Converse's, and what the gateway relays for each: an answer is relayed as finished only
for a reason that ends it (Anthropic's: gateway/upstream/anthropic_stops.py).

LiteLLM 1.108.7 maps a provider's reason with `map_finish_reason`, which gives `"stop"`
(a complete answer) for every reason it does not know and for some it knows to be
failures: `error` (OpenRouter and other OpenAI-compatible servers: the model failed
mid-answer), `network_error` (Zhipu), `abort` (vLLM, SGLang: the request was aborted,
unknown to it), DeepSeek's `insufficient_system_resource`, Gemini's
`MALFORMED_FUNCTION_CALL`; and Mistral's `model_length` (the context window ended the
answer, a `length`) as `"stop"` too. The client, and the completion record, were told the
answer was complete.

What is relayed (docs/api.md):
- OpenAI's wire (`OPENAI_FINISHED`): OpenAI's own reasons as they are, and those of the
  OpenAI-compatible servers that end an answer as what they mean (`model_length` as
  `length`, `eos`/`eos_token`/`stop_sequence` as `stop`, Zhipu's `sensitive` as
  `content_filter`); any other reason, or none, ends nothing (`openai_relayed` None);
- Gemini's and Vertex AI's `finishReason` (`GEMINI_FINISHED`), as LiteLLM maps them;
- Bedrock Converse's `stopReason` (`CONVERSE_FINISHED`), as LiteLLM maps them but
  `model_context_window_exceeded`, relayed as `length` (`CONVERSE_RELABELED`);
- Cohere's chat `finish_reason` (`COHERE_FINISHED`, v1 and v2 alike, on the
  `COHERE_ROUTES`): LiteLLM 1.108.7 reads none of a whole answer's (every one was
  `"stop"`, `MAX_TOKENS` and `TOOL_CALL` too) and maps a stream's with
  `map_finish_reason` (`ERROR` and `TIMEOUT` `"stop"`). `COMPLETE` and `STOP_SEQUENCE`
  are `stop`, `MAX_TOKENS` and v1's `ERROR_LIMIT` (the context window) `length`,
  `TOOL_CALL` `tool_calls`, v1's `ERROR_TOXIC` `content_filter`; `ERROR`, `TIMEOUT`, v1's
  `USER_CANCEL`, none or one unknown ends nothing;
- a Responses API answer (a chat LiteLLM bridges to it: gateway/upstream/responses_bridge.py)
  by its `status` (`responses_unfinished`): `completed` ends it (LiteLLM's `stop` or
  `tool_calls`), `incomplete` only for an `incomplete_details.reason` LiteLLM maps to what
  it means (`RESPONSES_INCOMPLETE`: `max_output_tokens` `length`, `content_filter`); an
  incomplete one without a reason (LiteLLM: `length`), `failed` without an error object,
  `cancelled`, `in_progress`, `queued` (LiteLLM: `stop`), none or another ends nothing.

An answer that did not end is the provider's failure: a whole one 502 `upstream_error`
(gateway/upstream/hosted_finish.py), a stream one closed before it finished, with the
gateway's error event and no `[DONE]` (gateway/upstream/stream_stops.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = [
    "COHERE_FINISHED",
    "COHERE_ROUTES",
    "CONVERSE_FINISHED",
    "CONVERSE_RELABELED",
    "GEMINI_FINISHED",
    "NOT_ENDED",
    "NO_REASON",
    "OPENAI_FINISHED",
    "RESPONSES_INCOMPLETE",
    "not_finished",
    "openai_relayed",
    "responses_incomplete",
    "responses_unfinished",
]

NO_REASON: Final = "ended without a finish reason (unfinished)"
NOT_ENDED: Final = "ended for a reason that does not finish it (unfinished)"

# OpenAI's wire: the reasons that end an answer, and the OpenAI reason each is relayed as.
OPENAI_FINISHED: Final[Mapping[str, str]] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "function_call",
    "content_filter": "content_filter",
    "model_length": "length",  # Mistral: the model's context window (LiteLLM: "stop")
    "eos": "stop",  # Together AI
    "eos_token": "stop",  # Hugging Face TGI
    "stop_sequence": "stop",  # Hugging Face TGI
    "sensitive": "content_filter",  # Zhipu GLM
}
# Gemini's and Vertex AI's `finishReason`s that end an answer, as LiteLLM 1.108.7 relays
# them (`map_finish_reason`: `stop`, `length`, `content_filter`). Not among them, and so
# unfinished: a null one or none (LiteLLM's `"stop"`), `FINISH_REASON_UNSPECIFIED`,
# `MALFORMED_FUNCTION_CALL`, `UNEXPECTED_TOOL_CALL`, `TOO_MANY_TOOL_CALLS`,
# `MALFORMED_RESPONSE`, `MISSING_THOUGHT_SIGNATURE` (each relayed as `"stop"`, a
# complete answer, though the model's output was cut or malformed) and any reason unknown.
GEMINI_FINISHED: Final = frozenset(
    {
        "STOP",
        "MAX_TOKENS",
        "CONTINUATION",
        "SAFETY",
        "RECITATION",
        "LANGUAGE",
        "OTHER",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "IMAGE_OTHER",
        "NO_IMAGE",
        "ESCALATION",
    }
)
# Bedrock Converse's `stopReason`s that end an answer.
CONVERSE_FINISHED: Final = frozenset(
    {
        "end_turn",
        "tool_use",
        "max_tokens",
        "stop_sequence",
        "guardrail_intervened",
        "content_filtered",
        "model_context_window_exceeded",
    }
)
# Those LiteLLM 1.108.7 maps otherwise (to `stop`), and what they are relayed as.
CONVERSE_RELABELED: Final[Mapping[str, str]] = {"model_context_window_exceeded": "length"}

# Cohere's chat `finish_reason`s that end an answer (v1's and v2's, docs.cohere.com "Chat"),
# and the OpenAI reason each is relayed as; and the `provider_model` prefixes LiteLLM
# sends to Cohere's chat API (both: `_complete_cohere_chat`, v1 when the model names `v1/`).
COHERE_FINISHED: Final[Mapping[str, str]] = {
    "COMPLETE": "stop",
    "STOP_SEQUENCE": "stop",
    "MAX_TOKENS": "length",
    "ERROR_LIMIT": "length",  # v1: the model's context limit
    "TOOL_CALL": "tool_calls",  # v2
    "ERROR_TOXIC": "content_filter",  # v1
}
COHERE_ROUTES: Final = frozenset({"cohere", "cohere_chat"})
# A Responses API answer's `incomplete_details.reason`s that end it, and what each is relayed as.
RESPONSES_INCOMPLETE: Final[Mapping[str, str]] = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}


def openai_relayed(reason: object) -> str | None:
    """The finish reason relayed for `reason`, a choice's on OpenAI's wire; None when it
    ends nothing (a failure, one unknown) or is missing."""
    return OPENAI_FINISHED.get(reason) if isinstance(reason, str) else None


def not_finished(
    reasons: list[object], finished: Mapping[str, object] | frozenset[str]
) -> str | None:
    """Why an answer whose choices (candidates) ended for `reasons` is unfinished, if one
    of them is null or not among those `finished`; None when each ended it."""
    if any(reason is None for reason in reasons):
        return NO_REASON
    if not all(isinstance(reason, str) and reason in finished for reason in reasons):
        return NOT_ENDED
    return None


def responses_unfinished(response: Mapping[str, object]) -> str | None:
    """Why a Responses API answer (`response`: its object, whole or a stream's terminal
    event's) is unfinished, by its `status`; None when it ended (see the module's notes)."""
    status = response.get("status")
    if status == "completed":
        return None
    if status == "incomplete":
        return None if responses_incomplete(response) is not None else NOT_ENDED
    return NO_REASON if status is None else NOT_ENDED


def responses_incomplete(response: Mapping[str, object]) -> str | None:
    """The finish reason an incomplete Responses API answer is relayed as
    (`RESPONSES_INCOMPLETE`); None when it is not incomplete for such a reason."""
    if response.get("status") != "incomplete":
        return None
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    return RESPONSES_INCOMPLETE.get(reason) if isinstance(reason, str) else None
