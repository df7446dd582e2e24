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

An honest Anthropic stream sends one `message_delta` with its `stop_reason`, then
`message_stop`, and ends. LiteLLM read no further than the first `message_delta` that
gave a finish reason (the next line, `event: ...`, was an empty chunk after the finish,
which ends its stream), so a second one that differs (`end_turn`, then `max_tokens`) was
never seen: relayed `stop` and `[DONE]`; and it took a second over a first that ends
nothing (`pause_turn`, then `end_turn`: `stop`). Which one the provider meant cannot be
told, so a stream whose `message_delta`s give two different stop reasons is unfinished.
Once a stop reason has come, the parser reads on to `message_stop` (or the stream's end;
all of it within one wait of the stream's idle bound) before it hands that chunk on,
keeping what it read for the chunks after it (`_reading_on`): a second, different reason
raises `ContradictoryStop` there, and the stream ends with the gateway's error event in
place of the finish, no `[DONE]` (its record: 502). A repeated reason, or a null one
after a reason, changes nothing. A stream that goes on past `_READ_ON` lines after its
stop reason without `message_stop` (an honest one sends `message_stop` next, a ping or
two at most) is unfinished the same way: a provider that padded the lines between two
reasons with pings had the first relayed, the second never read. (The gateway reads
LiteLLM's streams asynchronously; the parser's sync `__next__` is left as it is.)
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any, Final

from gateway.json_loads import json_object
from gateway.upstream.hosted_stream import StreamBoundNotFound

__all__ = [
    "FINISH_REASONS",
    "ContradictoryStop",
    "install_stop_reasons",
    "relabeled",
    "unfinished_stop",
]

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
_FIRST_REASON: Final = "_owngate_stop_reason"  # on a parser: the first stop reason it read
_READ: Final = "_owngate_read_on"  # on a parser: the chunks read on after the first reason
_STOPPED: Final = "_owngate_message_stop"  # on a parser: `message_stop` came
# The lines read on after a stop reason: `message_stop` is three (`event:`, `data:`, blank).
_READ_ON: Final = 64


class ContradictoryStop(RuntimeError):
    """An Anthropic stream gave a second `stop_reason` that differs from its first, or went
    on past `_READ_ON` lines after it without `message_stop`: which reason ended the answer
    cannot be told, so it is unfinished (the gateway's words only)."""


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
    for name, wrap in (("chunk_parser", _noting_stop), ("__anext__", _reading_on)):
        handle = getattr(parser, name, None)
        if not callable(handle):
            raise StreamBoundNotFound(f"{_PARSER[0]}.{_PARSER[1]}.{name} is not a method")
        if not getattr(handle, _INSTALLED, False):
            wrapped = functools.wraps(handle)(wrap(handle))
            setattr(wrapped, _INSTALLED, True)
            setattr(parser, name, wrapped)


def _stopping(handle: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handle)
    def stopping(parser: Any, chunk: Any) -> Any:
        handled = handle(parser, chunk)
        if not isinstance(handled, tuple) or not handled:
            raise StreamBoundNotFound(f"LiteLLM's {_METHOD} returned no (finish_reason, ...)")
        delta = chunk.get("delta") if isinstance(chunk, dict) else None
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        _one_reason(parser, reason)
        if unfinished_stop(reason) is not None:
            return (None, *handled[1:])  # no finish reason: the stream ends unfinished
        if reason in _RELABELED:
            return (FINISH_REASONS[reason], *handled[1:])
        return handled  # LiteLLM's (`stop` for a tool call that was its JSON mode's)

    setattr(stopping, _INSTALLED, True)
    return stopping


def _one_reason(parser: Any, reason: object) -> None:
    """Remember the first stop reason `parser`'s stream gave; raise `ContradictoryStop`
    when `reason` is another (a null one names none)."""
    if reason is None:
        return
    first = getattr(parser, _FIRST_REASON, None)
    if first is None:
        setattr(parser, _FIRST_REASON, reason)
    elif first != reason:
        raise ContradictoryStop("the stream gave two different stop reasons (unfinished)")


def _noting_stop(parse: Callable[..., Any]) -> Callable[..., Any]:
    def parsed(parser: Any, chunk: Any) -> Any:
        if isinstance(chunk, dict) and chunk.get("type") == "message_stop":
            setattr(parser, _STOPPED, True)
        return parse(parser, chunk)

    return parsed


def _reading_on(anext: Callable[..., Any]) -> Callable[..., Any]:
    async def reading_on(parser: Any) -> Any:
        read = getattr(parser, _READ, None)
        if read:  # what was read on: handed on in order
            return read.pop(0)
        chunk = await anext(parser)
        if read is None and getattr(parser, _FIRST_REASON, None) is not None:
            setattr(parser, _READ, await _read_on(anext, parser))
        return chunk

    return reading_on


async def _read_on(anext: Callable[..., Any], parser: Any) -> list[Any]:
    """The chunks after a stop reason, up to `message_stop` or the end of the stream: a
    `message_delta` among them is checked (`_one_reason`); past `_READ_ON` of them,
    `ContradictoryStop` (what came after them is not known)."""
    read: list[Any] = []
    while not getattr(parser, _STOPPED, False):
        if len(read) >= _READ_ON:
            raise ContradictoryStop("the stream went on after its stop reason (unfinished)")
        try:
            read.append(await anext(parser))
        except StopAsyncIteration:
            break
    return read
