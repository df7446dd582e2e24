"""The LiteLLM arguments a client's OpenAI request becomes, for a hosted provider.

Only the OpenAI API's documented request fields become LiteLLM arguments, each by its own
name. LiteLLM's keyword arguments are also its control channel (`api_base`, `api_key`,
`extra_headers`, `metadata`, `mock_response`, `fallbacks`, ...), so a client field outside
the allowlist could redirect the call, with the gateway's provider key, to a server of the
client's choosing. Other fields are therefore not sent; and since an answer made without
a field the client sent would not be what it asked for, and nothing would tell it so, such
a field is refused (`RefusedField`: 400 naming it, nothing sent) unless it asks for
nothing (gateway/upstream/unsent_fields.py).
The fields sent must have the JSON type the API documents, and their objects the
documented shape (gateway/upstream/openai_shapes.py; `InvalidField`
otherwise): LiteLLM fails on a wrong type in ways that look like a provider failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.openai_shapes import check_shapes
from gateway.upstream.openai_wire import Endpoint
from gateway.upstream.schema_refs import check_schema_refs
from gateway.upstream.unsent_fields import refuse_unsent

__all__ = ["forwarded_fields", "request_params"]

# From the OpenAI API reference: "Create chat completion", "Create completion" (legacy),
# "Create embeddings". `model` is set by the gateway and `stream` from the document's
# boolean; `metadata` is left out because LiteLLM reads it as its own logging metadata,
# and `store` because it asks the provider to keep the prompt and the answer (OpenAI's and
# Azure's stored completions, retrievable with the gateway's key): the client would
# lengthen the retention the policy checked against the backend's declaration (`store:
# true`, `web_search_options`, `audio`, built-in tools and prompt caches (`cache_control`
# in messages and tools, `prompt_cache_retention`) are refused before this:
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
# LiteLLM 1.108.7 relays a stream of several choices with one finish reason: the first it
# reads of any choice, put on index 0 at the stream's end (`CustomStreamWrapper` reads a
# chunk's first choice only). The others never get theirs, so a choice the provider cut
# short read as finished, `[DONE]` and all, and its record said 200. Refused unsent.
_ONE_CHOICE_STREAMS: Final = (
    "1 on a stream from a hosted provider (its adapter relays one choice's finish reason); "
    "ask without `stream` for several choices"
)
# The gateway counts a whole answer's choices against `n` (hosted_finish.py `short_of`):
# below 1, no answer meets it, and a provider that answered its one choice (Gemini reads
# candidateCount 0 as unset) was 502 `upstream_error`, blamed for the client's `n`.
_AT_LEAST_ONE: Final = "an integer of at least 1 (the choices asked for)"
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


# The OpenAI API's field names, of every endpoint: a refusal may name them (unsent_fields.py).
_KNOWN: Final = frozenset().union(*_FIELDS.values())


def forwarded_fields(endpoint: Endpoint) -> frozenset[str]:
    """The client's fields a hosted call of `endpoint` may send (the allowlist above)."""
    return _FIELDS[endpoint]


def request_params(endpoint: Endpoint, doc: Mapping[str, Any]) -> dict[str, Any]:
    """LiteLLM arguments for the client's document.

    Raises `RefusedField` for a field outside the allowlist, or a key of `stream_options`
    but `include_usage`, that asks for something (unsent_fields.py `refuse_unsent`);
    `InvalidField` for a field of the wrong JSON type, a malformed message, a missing
    required field (`messages`, `prompt`, `input`), a schema whose `$ref`s would expand
    past `schema_refs.MAX_INLINED` values, fewer than one choice (`n` < 1), or a stream
    of several choices (`n` > 1: `_ONE_CHOICE_STREAMS`).
    Streams always ask the provider for usage (`stream_options.include_usage`): the
    gateway accounts for tokens either way, and `encode_chunk` keeps the usage chunk
    from clients that did not ask for it. No other `stream_options` key is sent.
    """
    allowed = _FIELDS[endpoint]
    params = {k: v for k, v in doc.items() if k in allowed and v is not None}
    required = _REQUIRED[endpoint]
    if required not in params:
        raise InvalidField(required, "given (the field is required)")
    for name, value in params.items():
        _check_type(name, value, _TYPES.get(name))
    if params.get("n", 1) < 1:  # an integer by now; `short_of` counts choices by it
        raise InvalidField("n", _AT_LEAST_ONE)
    check_shapes(endpoint, params)
    check_schema_refs(params)  # `$ref`s an adapter inlines: bounded (schema_refs.py)
    refuse_unsent(endpoint, doc, allowed | _HANDLED, _KNOWN)
    if endpoint != "embeddings" and doc.get("stream") is True:
        if (params.get("n") or 1) > 1:
            raise InvalidField("n", _ONE_CHOICE_STREAMS)
        params["stream"] = True
        params["stream_options"] = {"include_usage": True}
    return params


def _check_type(param: str, value: Any, types: tuple[type, ...] | None) -> None:
    if types is None:
        return
    # Python's bool is an int; JSON's true is not a number.
    wrong_bool = isinstance(value, bool) and bool not in types
    if wrong_bool or not isinstance(value, types):
        raise InvalidField(param, " or ".join(_TYPE_NAMES[t] for t in types if t in _TYPE_NAMES))
