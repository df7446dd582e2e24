"""OpenAI request fields in, OpenAI response bytes out, around LiteLLM's own objects.

Requests: only the OpenAI API's documented request fields become LiteLLM arguments, each
by its own name. LiteLLM's keyword arguments are also its control channel (`api_base`,
`api_key`, `extra_headers`, `metadata`, `mock_response`, `fallbacks`, ...), so a client
field outside the allowlist could redirect the call, with the gateway's provider key,
to a server of the client's choosing. Other fields are therefore not sent, and their
names are reported back so the gateway can say so. The fields sent must have the JSON
type the API documents, and messages their documented shape (`InvalidField` otherwise):
LiteLLM fails on a wrong type in ways that look like a provider failure.

Responses: LiteLLM's pydantic objects carry its own additions (`provider_specific_fields`,
LiteLLM-only usage counters, `None` for fields the provider did not send). They are
dumped once, those additions dropped, and the OpenAI shape restored where LiteLLM departs
from it (a stream's usage chunk has `choices: []`; a chunk choice always has
`finish_reason`; a text completion's text is never null).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import orjson

__all__ = [
    "DONE",
    "USER_CONTENT_TYPES",
    "Endpoint",
    "InvalidField",
    "encode_chunk",
    "encode_response",
    "include_usage",
    "request_params",
    "usage_of",
]

Endpoint = Literal["chat", "completions", "embeddings"]

DONE: Final = b"data: [DONE]\n\n"

# From the OpenAI API reference: "Create chat completion", "Create completion" (legacy),
# "Create embeddings". `model` is set by the gateway and `stream` from the document's
# boolean; `metadata` is left out because LiteLLM reads it as its own logging metadata,
# and `store` because it asks the provider to keep the prompt and the answer (OpenAI's and
# Azure's stored completions, retrievable with the gateway's key): the client would
# lengthen the retention the policy checked against the backend's declaration (`store:
# true`, `web_search_options`, `audio` and built-in tools are refused before this:
# gateway/upstream/hosted_fields.py).
_SAMPLING: Final = frozenset(
    {
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "temperature",
        "top_p",
        "user",
    }
)
_FIELDS: Final[dict[str, frozenset[str]]] = {
    "chat": _SAMPLING
    | {
        "messages",
        "audio",
        "function_call",
        "functions",
        "max_completion_tokens",
        "modalities",
        "parallel_tool_calls",
        "prediction",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "service_tier",
        "tool_choice",
        "tools",
        "top_logprobs",
        "verbosity",
        "web_search_options",
    },
    "completions": _SAMPLING | {"prompt", "best_of", "echo", "suffix"},
    "embeddings": frozenset({"input", "dimensions", "encoding_format", "user"}),
}
_HANDLED: Final = frozenset({"model", "stream", "stream_options"})
# The field each endpoint requires (the same reference). LiteLLM 1.108.7 calls a text
# completion without `prompt` and fails on its own (`APIConnectionError`), which read as
# the provider failing: 503 and the next backend tried, for the client's mistake.
_REQUIRED: Final[dict[str, str]] = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
}

# The JSON type of each field, from the same reference; `None` (null) is always allowed.
# bool is not a number here, though Python makes it an int.
_NUMBER: Final = (int, float)
_TYPES: Final[dict[str, tuple[type, ...]]] = {
    **dict.fromkeys(("frequency_penalty", "presence_penalty", "temperature", "top_p"), _NUMBER),
    **dict.fromkeys(
        ("max_tokens", "max_completion_tokens", "n", "seed", "best_of", "top_logprobs"), (int,)
    ),
    "dimensions": (int,),
    "logprobs": (bool, int),  # a boolean for chat, an integer for completions
    **dict.fromkeys(("echo", "parallel_tool_calls"), (bool,)),
    **dict.fromkeys(
        (
            "user",
            "suffix",
            "encoding_format",
            "service_tier",
            "reasoning_effort",
            "verbosity",
            "prompt_cache_key",
            "safety_identifier",
        ),
        (str,),
    ),
    **dict.fromkeys(
        ("logit_bias", "response_format", "audio", "prediction", "web_search_options"), (dict,)
    ),
    **dict.fromkeys(("messages", "tools", "functions", "modalities"), (list,)),
    **dict.fromkeys(("stop", "prompt", "input"), (str, list)),
    **dict.fromkeys(("tool_choice", "function_call"), (str, dict)),
}
_TYPE_NAMES: Final = {
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    str: "a string",
    dict: "an object",
    list: "an array",
}
# The content part types LiteLLM 1.108.7 accepts in a user message
# (`litellm.types.llms.openai.ValidUserMessageContentTypes`; a test compares them): it
# raises on any other before calling the provider.
USER_CONTENT_TYPES: Final = frozenset(
    {
        "text",
        "image_url",
        "input_audio",
        "audio_url",
        "document",
        "guarded_text",
        "grounding_source",
        "query",
        "video_url",
        "file",
    }
)

# The content part types each role may send (the API reference; for users, LiteLLM's list).
_PART_TYPES: Final[dict[str, frozenset[str]]] = {
    "user": USER_CONTENT_TYPES,
    "system": frozenset({"text"}),
    "developer": frozenset({"text"}),
    "assistant": frozenset({"text", "refusal"}),
    "tool": frozenset({"text"}),
}
# The roles whose `content` may be null (an assistant turn that only calls tools).
_NULL_CONTENT_ROLES: Final = frozenset({"assistant", "function"})


class InvalidField(ValueError):
    """A request field LiteLLM could not take: the wrong JSON type, or a malformed message.

    `param` names the field (`messages[2].content`); the message says what was expected
    and never repeats the value."""

    def __init__(self, param: str, expected: str) -> None:
        super().__init__(f"`{param}` must be {expected}")
        self.param = param


_LITELLM_ONLY: Final = frozenset({"provider_specific_fields"})
_USAGE_COUNTS: Final = ("prompt_tokens", "completion_tokens", "total_tokens")
_USAGE_DETAILS: Final = {
    "prompt_tokens_details": ("cached_tokens", "audio_tokens"),
    "completion_tokens_details": (
        "reasoning_tokens",
        "audio_tokens",
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
    ),
}


def request_params(
    endpoint: Endpoint, doc: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """LiteLLM arguments for the client's document, and the names of fields left out.

    Raises `InvalidField` for a field of the wrong JSON type, a malformed message, or a
    missing required field (`messages`, `prompt`, `input`).
    Streams always ask the provider for usage (`stream_options.include_usage`): the
    gateway accounts for tokens either way, and `encode_chunk` keeps the usage chunk
    from clients that did not ask for it.
    """
    allowed = _FIELDS[endpoint]
    params = {k: v for k, v in doc.items() if k in allowed and v is not None}
    required = _REQUIRED[endpoint]
    if required not in params:
        raise InvalidField(required, "given (the field is required)")
    for name, value in params.items():
        _check_type(name, value, _TYPES.get(name))
    _check_shapes(params)
    if endpoint == "chat":
        _check_messages(params.get("messages"))
    ignored = tuple(sorted(k for k in doc if k not in allowed and k not in _HANDLED))
    if endpoint != "embeddings" and doc.get("stream") is True:
        options = doc.get("stream_options")
        params["stream"] = True
        params["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
    return params, ignored


def _check_type(param: str, value: Any, types: tuple[type, ...] | None) -> None:
    if types is None:
        return
    # Python's bool is an int; JSON's true is not a number.
    wrong_bool = isinstance(value, bool) and bool not in types
    if wrong_bool or not isinstance(value, types):
        raise InvalidField(param, " or ".join(_TYPE_NAMES[t] for t in types if t in _TYPE_NAMES))


def _check_shapes(params: dict[str, Any]) -> None:
    """The parts of the API's object shapes LiteLLM reads without checking."""
    stop = params.get("stop")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise InvalidField("stop", "a string or an array of strings")
    response_format = params.get("response_format")
    if response_format is not None and not isinstance(response_format.get("type"), str):
        raise InvalidField("response_format.type", "a string")
    for i, tool in enumerate(params.get("tools") or ()):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise InvalidField(where, "an object with a string `type`")
        function = tool.get("function")
        if tool["type"] == "function" and not (
            isinstance(function, dict) and isinstance(function.get("name"), str)
        ):
            raise InvalidField(f"{where}.function", "an object with a string `name`")
    # LiteLLM's Gemini adapter raised TypeError on an entry that is not an object (a
    # string, a number): read as the provider failing, it counted on the hosted
    # backend's breaker, shared by every tenant, for the client's malformed request.
    for i, function in enumerate(params.get("functions") or ()):
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidField(f"functions[{i}]", "an object with a string `name`")


def _check_messages(messages: Any) -> None:
    """Each message an object with a string `role`; its `content` a string or an array of
    content parts, each an object with a string `type` that its role may send (for a user
    message, one LiteLLM knows); null only for an assistant (or legacy function) message."""
    if messages is None:
        return
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidField(where, "an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidField(f"{where}.role", "a string")
        content = message.get("content")
        if content is None and role in _NULL_CONTENT_ROLES:
            continue
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            nullable = " or null" if role in _NULL_CONTENT_ROLES else ""
            raise InvalidField(
                f"{where}.content", f"a string or an array of content parts{nullable}"
            )
        known = _PART_TYPES.get(role)  # an unknown role: LiteLLM or the provider decides
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str) or (known is not None and kind not in known):
                raise InvalidField(
                    f"{where}.content[{j}]",
                    f"a content part object with a `type` a {role} may send",
                )


def include_usage(doc: Mapping[str, Any]) -> bool:
    """Whether a streaming client asked for the final usage chunk."""
    options = doc.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def encode_response(endpoint: Endpoint, result: Any) -> tuple[bytes, dict[str, int] | None]:
    """The OpenAI JSON body for a LiteLLM non-streaming result, and its token usage."""
    doc = _dump(result)
    usage = usage_of(doc.get("usage"))
    if endpoint == "embeddings":
        for item in doc.get("data") or ():
            if isinstance(item, dict):
                item.setdefault("object", "embedding")
        if usage is not None:
            doc["usage"] = {
                "prompt_tokens": usage["prompt_tokens"],
                "total_tokens": usage["total_tokens"],
            }
        return orjson.dumps(doc), usage
    if usage is not None:
        doc["usage"] = _usage_body(doc["usage"])
    else:  # LiteLLM's zeros where the provider reported none: not the provider's counts
        doc.pop("usage", None)
    for choice in doc.get("choices") or ():
        if endpoint == "chat" and isinstance(choice.get("message"), dict):
            choice["message"].setdefault("content", None)
        elif endpoint == "completions":
            choice.setdefault("text", "")
        choice.setdefault("finish_reason", None)
    return orjson.dumps(doc), usage


def encode_chunk(
    endpoint: Endpoint, chunk: Any, *, with_usage: bool
) -> tuple[bytes | None, dict[str, int] | None]:
    """One `data: {...}` SSE event for a LiteLLM stream chunk (None: nothing to send),
    and the usage it reported, if any (kept for accounting even when not sent)."""
    doc = _dump(chunk)
    usage = usage_of(doc.pop("usage", None))
    choices = doc.get("choices") or []
    for choice in choices:
        choice.setdefault("finish_reason", None)
        if endpoint == "completions":
            choice.setdefault("text", "")
        else:
            choice.setdefault("delta", {})
    if usage is not None and all(_is_empty(c, endpoint) for c in choices):
        if not with_usage:
            return None, usage
        doc["choices"] = []
    if with_usage and usage is not None:
        doc["usage"] = usage
    return b"data: " + orjson.dumps(doc) + b"\n\n", usage


def usage_of(value: Any) -> dict[str, int] | None:
    """The three token counts of a usage object; None when absent or all zero (LiteLLM
    puts zero usage on every text-completion chunk)."""
    if not isinstance(value, dict):
        return None
    counts = {k: value.get(k) for k in _USAGE_COUNTS}
    # `type`, not `isinstance`: `true` is no count (a bool is an int to Python).
    if not all(type(v) is int for v in counts.values()) or not any(counts.values()):
        return None
    return {k: int(v) for k, v in counts.items() if v is not None}


def _usage_body(usage: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {k: usage[k] for k in _USAGE_COUNTS}
    for key, fields in _USAGE_DETAILS.items():
        detail = usage.get(key)
        if isinstance(detail, dict):
            kept = {f: detail[f] for f in fields if isinstance(detail.get(f), int)}
            if kept:
                body[key] = kept
    return body


def _is_empty(choice: dict[str, Any], endpoint: Endpoint) -> bool:
    if choice.get("finish_reason") is not None:
        return False
    if endpoint == "completions":
        return not choice.get("text")
    return not choice.get("delta")


def _dump(result: Any) -> dict[str, Any]:
    # warnings=False: base64 embeddings are strings in a field LiteLLM types as
    # list[float]; pydantic warns on serialising them, though the value is right.
    raw = result if isinstance(result, dict) else result.model_dump(warnings=False)
    cleaned = _clean(raw)
    if not isinstance(cleaned, dict):
        raise TypeError(f"LiteLLM returned {type(result).__name__}, not an object")
    return cleaned


def _clean(value: Any) -> Any:
    """Drop `None` values and LiteLLM-only keys, recursively."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None and k not in _LITELLM_ONLY}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value
