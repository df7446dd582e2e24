"""Anthropic stop reasons as a hosted answer's finish reason: relayed as finished only
for a reason that says the turn ended.

LiteLLM 1.108.7 maps an Anthropic `stop_reason` with `map_finish_reason`, which gives
`"stop"` for any reason it does not know, and its stream parser (`ModelResponseIterator.
_handle_message_delta`, under Bedrock's and Vertex AI's Anthropic streams too) gives
`"stop"` for a `message_delta` whose `stop_reason` is null or missing. `pause_turn`
(Anthropic paused a long-running turn; its client is to send the answer back for the
model to go on) is one it does not know: the client was told, `[DONE]` and all, that a
paused answer was complete, and its completion record said 200. So were a null reason on
a stream and any reason Anthropic adds later.

What the gateway does (docs/api.md):
- the reasons LiteLLM maps to what they mean (`FINISH_REASONS`: `end_turn` and
  `stop_sequence` to `stop`, `max_tokens` to `length`, `tool_use` to `tool_calls`,
  `refusal` to `content_filter`) are relayed as LiteLLM maps them;
- `model_context_window_exceeded` (the context window ended the answer, not
  `max_tokens`) is relayed as `length`, not LiteLLM's `stop` (`relabeled`);
- any other reason (`pause_turn` among them) or none leaves the answer unfinished: a
  stream gets no finish reason from it (`install_stop_reasons`), so it is one the provider
  closed before finishing (gateway/upstream/hosted_stream.py: the gateway's error event,
  no `[DONE]`, 502 in the record), and a whole answer is the provider's failure
  (`unfinished_stop`, read by gateway/upstream/hosted_finish.py from the raw answer: 502
  `upstream_error` as the last attempt). OpenAI's format has no finish reason for a
  paused turn, and the gateway does not send the answer back for the client.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any, Final

from gateway.json_loads import json_object
from gateway.upstream.hosted_stream import StreamBoundNotFound

__all__ = ["FINISH_REASONS", "install_stop_reasons", "relabeled", "unfinished_stop"]

# Anthropic's stop reasons that end a turn, and the OpenAI finish reason each is relayed as.
FINISH_REASONS: Final[Mapping[str, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
}
# Those LiteLLM 1.108.7 maps otherwise (to `stop`, as it maps any reason it does not know).
_RELABELED: Final = frozenset({"model_context_window_exceeded"})
# LiteLLM 1.108.7: the parser (module, class) and the method that maps a `message_delta`.
_PARSER: Final = ("litellm.llms.anthropic.chat.handler", "ModelResponseIterator")
_METHOD: Final = "_handle_message_delta"
_INSTALLED: Final = "_owngate_stop_reasons"


def unfinished_stop(stop_reason: object) -> str | None:
    """Why an Anthropic answer that ended with `stop_reason` is unfinished (the gateway's
    words: a reason is named only when it is Anthropic's `pause_turn`); None when the
    turn ended."""
    if isinstance(stop_reason, str) and stop_reason in FINISH_REASONS:
        return None
    if stop_reason is None:
        return "ended without a finish reason (unfinished)"
    if stop_reason == "pause_turn":
        return "paused its turn (pause_turn: unfinished)"
    return "ended for a reason the gateway does not know (unfinished)"


def relabeled(answer: bytes | None) -> str | None:
    """The finish reason a whole Anthropic answer, or a Bedrock Converse one (the
    provider's raw bytes), is relayed with where LiteLLM's is not it (`_RELABELED`),
    else None."""
    if not answer or not any(reason.encode() in answer for reason in _RELABELED):
        return None  # most answers: no second parse
    doc = json_object(answer)
    if doc is None:
        return None
    if doc.get("type") == "message":
        reason = doc.get("stop_reason")
    elif isinstance(doc.get("output"), dict):  # Bedrock Converse (Claude's reasons, camelCase)
        reason = doc.get("stopReason")
    else:
        return None
    return FINISH_REASONS[reason] if reason in _RELABELED else None


def install_stop_reasons() -> None:
    """Make LiteLLM's Anthropic stream parser give a `message_delta` the finish reason
    `FINISH_REASONS` says, and none for a reason not there (or null). Idempotent;
    LiteLLM loaded. Raises `StreamBoundNotFound` when the parser is not shaped so."""
    parser = getattr(importlib.import_module(_PARSER[0]), _PARSER[1], None)
    method = getattr(parser, _METHOD, None)
    if not isinstance(parser, type) or not callable(method):
        raise StreamBoundNotFound(f"{_PARSER[0]}.{_PARSER[1]}.{_METHOD} is not a method")
    if not getattr(method, _INSTALLED, False):
        setattr(parser, _METHOD, _stopping(method))


def _stopping(handle: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handle)
    def stopping(parser: Any, chunk: Any) -> Any:
        handled = handle(parser, chunk)
        if not isinstance(handled, tuple) or not handled:
            raise StreamBoundNotFound(f"LiteLLM's {_METHOD} returned no (finish_reason, ...)")
        delta = chunk.get("delta") if isinstance(chunk, dict) else None
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if unfinished_stop(reason) is not None:
            return (None, *handled[1:])  # no finish reason: the stream ends unfinished
        if reason in _RELABELED:
            return (FINISH_REASONS[reason], *handled[1:])
        return handled  # LiteLLM's (`stop` for a tool call that was its JSON mode's)

    setattr(stopping, _INSTALLED, True)
    return stopping
