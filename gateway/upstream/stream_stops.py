"""A hosted stream's finish reasons as its provider gave them, on OpenAI's wire, Gemini's
and Bedrock Converse's (gateway/upstream/litellm_runtime.py calls `install_stream_stops`
at load; the reasons and what each is relayed as: gateway/upstream/finish_reasons.py).

LiteLLM 1.108.7 maps a stream's finish reason to `"stop"` where the provider's did not
end the answer, and the stream then ends with that `"stop"` and `[DONE]`:
- OpenAI's wire: `abort`, `network_error` and any reason it does not know (its
  `map_finish_reason`), Mistral's `model_length` (a `length`) too; and its own parser of
  an OpenAI-compatible stream (every provider but `openai`/`azure`, which the OpenAI SDK
  reads: `BaseModelResponseIterator._handle_string_chunk`) makes up a `"stop"` from
  `data: [DONE]`, or from any line holding `[DONE]`, a delta's text included, whatever
  the provider said before it;
- Gemini's: every chunk's candidate without a `finishReason`, or with
  `MALFORMED_FUNCTION_CALL` or one unknown (`VertexGeminiConfig._check_finish_reason`):
  a stream cut short was complete;
- Converse's: a `stopReason` it does not know; `model_context_window_exceeded` too;
- Cohere's chat (v1's stream-end `finish_reason`, v2's `message-end` as LiteLLM's parser
  reads it): `ERROR`, `TIMEOUT`, `USER_CANCEL` and any it does not know, and a v2 end
  without a reason (its parser's default `"stop"`);
- a Responses API stream under LiteLLM's chat bridge: its terminal event's response is
  judged by its `status` (finish_reasons.py `responses_unfinished`): `incomplete` for no
  reason (LiteLLM's `length`) ends nothing, nor does a `response.completed` whose status
  is not `completed` (LiteLLM's `stop`); an incomplete one for `max_output_tokens` or
  `content_filter` is `length` or `content_filter`, by its status whichever event said it.

Here the chunk's finish reason is the provider's, judged as a whole answer's is: one
that ends the answer is relayed as finish_reasons.py says, any other (or none) is no
finish reason, so the stream is one its provider closed before finishing
(gateway/upstream/hosted_stream.py: the gateway's error event, no `[DONE]`, 502 in the
record). `data: [DONE]` is the end of the stream, not a finish reason.

The last chunk LiteLLM makes up when the provider gave no finish reason
(`finish_reason_handler`) has none either, where it had `"stop"`: the gateway tells that
chunk from the provider's by the wrapper it reads (hosted_stream.py `made_up_end`), which
a text completion's stream on an OpenAI-style `/completions` route hides (LiteLLM wraps
it in a generator), so such a stream that ended without a finish reason was relayed with
LiteLLM's `"stop"` and `[DONE]`.

LiteLLM remembers a Gemini chunk's finish reason only until the next chunk (its wrapper's
`intermittent_finish_reason`, set from every chunk it reads), so a chunk of no choice
after the finish (Gemini's usage only) made it forget the reason: a finished stream was
broken off as unfinished. Such a chunk keeps the reason given before (`_sdk_chunk`); a
stream that gave none still has none.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any, Final

from gateway.upstream.finish_reasons import (
    COHERE_FINISHED,
    CONVERSE_FINISHED,
    CONVERSE_RELABELED,
    GEMINI_FINISHED,
    openai_relayed,
    responses_incomplete,
    responses_unfinished,
)
from gateway.upstream.hosted_stream import StreamBoundNotFound

__all__ = ["honest_choices", "install_stream_stops"]

# LiteLLM 1.108.7: (module, class, method) of each place a stream's chunk is parsed.
_WRAPPER: Final = "litellm.litellm_core_utils.streaming_handler", "CustomStreamWrapper"
_MADE_UP_END: Final = (*_WRAPPER, "finish_reason_handler")
_OPENAI_SDK_CHUNKS: Final = (  # the OpenAI SDK's chunk objects, on CustomStreamWrapper
    "handle_openai_chat_completion_chunk",
    "handle_openai_text_completion_chunk",
    "handle_azure_text_completion_chunk",
)
_LINES: Final = (
    "litellm.llms.base_llm.base_model_iterator",
    "BaseModelResponseIterator",
    "_handle_string_chunk",
)
_OPENAI_DICTS: Final = (  # called on a chunk's dict by Bedrock's OpenAI-compatible decoder too
    "litellm.llms.openai.chat.gpt_transformation",
    "OpenAIChatCompletionStreamingHandler",
    "chunk_parser",
)
_GEMINI: Final = (
    "litellm.llms.vertex_ai.gemini.vertex_and_google_ai_studio_gemini",
    "ModelResponseIterator",
    "chunk_parser",
)
_CONVERSE: Final = (
    "litellm.llms.bedrock.chat.invoke_handler",
    "AWSEventStreamDecoder",
    "converse_chunk_parser",
)
_COHERE_V1: Final = ("litellm.llms.cohere.common_utils", "ModelResponseIterator", "chunk_parser")
_COHERE_V2: Final = (
    "litellm.llms.cohere.common_utils",
    "CohereV2ModelResponseIterator",
    "chunk_parser",
)
_BRIDGED: Final = (
    "litellm.completion_extras.litellm_responses_transformation.transformation",
    "OpenAiResponsesToChatCompletionStreamIterator",
    "chunk_parser",
)
_TERMINAL: Final = frozenset({"response.completed", "response.incomplete"})
_INSTALLED: Final = "_owngate_stream_stops"


def install_stream_stops() -> None:
    """Make LiteLLM's stream parsers give each chunk the finish reason its provider gave
    (see the module's notes). Idempotent; LiteLLM loaded. Raises `StreamBoundNotFound`
    when LiteLLM is not shaped as this expects."""
    for name in _OPENAI_SDK_CHUNKS:
        _wrap((*_WRAPPER, name), _sdk_chunk)
    _wrap(_MADE_UP_END, _made_up_end)
    _wrap(_LINES, _line)
    _wrap(_OPENAI_DICTS, _openai_dict)
    _wrap(_GEMINI, _gemini_chunk)
    _wrap(_CONVERSE, _converse_chunk)
    _wrap(_COHERE_V1, _cohere_chunk)
    _wrap(_COHERE_V2, _cohere_chunk)
    _wrap(_BRIDGED, _bridged_chunk)


def _wrap(where: tuple[str, str, str], make: Callable[[Callable[..., Any]], Any]) -> None:
    module, name, method = where
    cls = getattr(importlib.import_module(module), name, None)
    parse = getattr(cls, method, None)
    if not isinstance(cls, type) or not callable(parse):
        raise StreamBoundNotFound(f"{module}.{name}.{method} is not a method")
    if getattr(parse, _INSTALLED, False):
        return
    wrapped = functools.wraps(parse)(make(parse))
    setattr(wrapped, _INSTALLED, True)
    setattr(cls, method, wrapped)


def honest_choices(choices: object) -> None:
    """Give each of `choices` (a chunk's on OpenAI's wire: dicts or the OpenAI SDK's
    objects) the finish reason relayed for its provider's (`openai_relayed`), None where
    that ends nothing; a choice without one is left as it is."""
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict):
            reason = choice.get("finish_reason")
            if reason is not None and openai_relayed(reason) != reason:
                choice["finish_reason"] = openai_relayed(reason)
            continue
        reason = getattr(choice, "finish_reason", None)
        if reason is not None and openai_relayed(reason) != reason:
            choice.finish_reason = openai_relayed(reason)


def _sdk_chunk(handle: Callable[..., Any]) -> Callable[..., Any]:
    def handled(wrapper: Any, chunk: Any) -> Any:
        if isinstance(chunk, dict):
            return handle(wrapper, chunk)
        choices = getattr(chunk, "choices", None)
        honest_choices(choices)
        read = handle(wrapper, chunk)
        if not choices and isinstance(read, dict) and read.get("finish_reason") is None:
            # A chunk of no choice (usage only, after the finish) ends nothing and keeps
            # the reason given before: the wrapper sets its remembered one from this.
            read["finish_reason"] = wrapper.intermittent_finish_reason
        return read

    return handled


def _made_up_end(handle: Callable[..., Any]) -> Callable[..., Any]:
    def handled(wrapper: Any) -> Any:
        chunk = handle(wrapper)
        if wrapper.received_finish_reason is None and wrapper.intermittent_finish_reason is None:
            for choice in getattr(chunk, "choices", None) or ():
                choice.finish_reason = None  # LiteLLM's "stop": the provider gave none
        return chunk

    return handled


def _line(handle: Callable[..., Any]) -> Callable[..., Any]:
    def handled(parser: Any, str_line: str) -> Any:
        base = getattr(importlib.import_module(_LINES[0]), _LINES[1])  # loaded: a lookup
        parsed = base._string_to_dict_parser(str_line=str_line)
        if isinstance(parsed, dict) and parsed:  # a chunk, whatever its text holds
            honest_choices(parsed.get("choices"))
            return parser.chunk_parser(chunk=parsed)
        if "[DONE]" in str_line:  # the end of the stream, no finish reason of its own
            return _no_finish()
        return handle(parser, str_line)

    return handled


def _no_finish() -> Any:
    from litellm.types.utils import GenericStreamingChunk  # loaded with LiteLLM

    return GenericStreamingChunk(
        text="", is_finished=False, finish_reason="", usage=None, index=0, tool_use=None
    )


def _openai_dict(parse: Callable[..., Any]) -> Callable[..., Any]:
    def parsed(parser: Any, chunk: Any) -> Any:
        if isinstance(chunk, dict):
            honest_choices(chunk.get("choices"))
        return parse(parser, chunk)

    return parsed


def _gemini_chunk(parse: Callable[..., Any]) -> Callable[..., Any]:
    def parsed(parser: Any, chunk: Any) -> Any:
        result = parse(parser, chunk)
        candidates = chunk.get("candidates") if isinstance(chunk, dict) else None
        if result is None or not isinstance(candidates, list) or not candidates:
            return result  # a chunk of no candidate (a blocked prompt's): LiteLLM's
        reasons = {
            c.get("index", place): c.get("finishReason")
            for place, c in enumerate(candidates)
            if isinstance(c, dict)
        }
        for choice in getattr(result, "choices", None) or ():
            if reasons.get(getattr(choice, "index", None)) not in GEMINI_FINISHED:
                choice.finish_reason = None  # LiteLLM's "stop": none, or one that ends nothing
        return result

    return parsed


def _converse_chunk(parse: Callable[..., Any]) -> Callable[..., Any]:
    def parsed(parser: Any, chunk_data: Any) -> Any:
        result = parse(parser, chunk_data)
        if not isinstance(chunk_data, dict) or "stopReason" not in chunk_data:
            return result
        reason = chunk_data["stopReason"]
        for choice in getattr(result, "choices", None) or ():
            if not isinstance(reason, str) or reason not in CONVERSE_FINISHED:
                choice.finish_reason = None
            elif reason in CONVERSE_RELABELED:
                choice.finish_reason = CONVERSE_RELABELED[reason]
        return result

    return parsed


def _cohere_chunk(parse: Callable[..., Any]) -> Callable[..., Any]:
    def parsed(parser: Any, chunk: Any) -> Any:
        result = parse(parser, chunk)
        if not isinstance(result, dict) or not result.get("is_finished"):
            return result  # not the end: LiteLLM's
        reason = _cohere_reason(chunk)
        relayed = COHERE_FINISHED.get(reason) if isinstance(reason, str) else None
        result["finish_reason"] = relayed or ""  # none, or one that ends nothing: no finish
        result["is_finished"] = relayed is not None
        return result

    return parsed


def _cohere_reason(chunk: Any) -> object:
    """The `finish_reason` of a Cohere stream's end, where LiteLLM reads it: v1's
    `stream-end` itself, v2's `data.delta` of a `message-end` event; None where none."""
    if not isinstance(chunk, dict):
        return None
    if chunk.get("event") == "message-end":
        data = chunk.get("data")
        delta = data.get("delta") if isinstance(data, dict) else None
        return delta.get("finish_reason") if isinstance(delta, dict) else None
    return chunk.get("finish_reason")


def _bridged_chunk(parse: Callable[..., Any]) -> Callable[..., Any]:
    def parsed(parser: Any, chunk: Any) -> Any:
        result = parse(parser, chunk)
        if not isinstance(chunk, dict) or chunk.get("type") not in _TERMINAL:
            return result
        response = chunk.get("response")
        response = response if isinstance(response, dict) else {}
        ended = responses_unfinished(response) is None
        relayed = responses_incomplete(response)  # None for a completed one: LiteLLM's
        for choice in getattr(result, "choices", None) or ():
            if not ended:
                choice.finish_reason = None  # LiteLLM's "stop" or "length": it did not end
            elif relayed is not None:
                choice.finish_reason = relayed
        return result

    return parsed
