"""OpenAI response bytes out of LiteLLM's own objects (the request side is
gateway/upstream/openai_request.py).

LiteLLM's pydantic objects carry its own additions (`provider_specific_fields`,
LiteLLM-only usage counters, `None` for fields the provider did not send). They are
dumped once, those additions dropped, and the OpenAI shape restored where LiteLLM departs
from it (a stream's usage chunk has `choices: []`; a chunk choice always has
`finish_reason`; a text completion's text is never null).

An embeddings request's `encoding_format: "base64"` (what the OpenAI SDKs send unless told
otherwise) is dropped by the adapters that have no such option (Gemini's, Vertex AI's:
LiteLLM 1.108.7's mapping leaves it out without a word), whose answer is floats: the
client asked for base64 and got a list. Such an answer's vectors are given as OpenAI gives
them (`base64_embedding`: each number as a little-endian float32, the bytes in base64),
so the client gets the encoding it asked for whichever adapter served it; a vector the
provider sent as base64 already is left as it is. A vector of numbers relayed as such holds
only finite numbers (`_finite`): orjson writes a provider's `NaN` or `Infinity` as `null`.
"""

from __future__ import annotations

import array
import base64
import math
import sys
from collections.abc import Mapping
from typing import Any, Final, Literal

import orjson

from gateway.canonical import MAX_SAFE_INTEGER

__all__ = [
    "DONE",
    "Endpoint",
    "base64_embedding",
    "encode_chunk",
    "encode_response",
    "include_usage",
    "usage_of",
]

Endpoint = Literal["chat", "completions", "embeddings"]

DONE: Final = b"data: [DONE]\n\n"

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


def include_usage(doc: Mapping[str, Any]) -> bool:
    """Whether a streaming client asked for the final usage chunk."""
    options = doc.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def encode_response(
    endpoint: Endpoint, result: Any, *, in_base64: bool = False
) -> tuple[bytes, dict[str, int] | None]:
    """The OpenAI JSON body for a LiteLLM non-streaming result, and its token usage;
    an embedding given as a list of numbers is written in base64 when `in_base64` (the
    client asked `encoding_format: "base64"`)."""
    doc = _dump(result)
    usage = usage_of(doc.get("usage"))
    if endpoint == "embeddings":
        for item in doc.get("data") or ():
            if isinstance(item, dict):
                item.setdefault("object", "embedding")
                vector = item.get("embedding")
                if isinstance(vector, list):
                    item["embedding"] = (base64_embedding if in_base64 else _finite)(vector)
        if usage is not None:
            doc["usage"] = {
                "prompt_tokens": usage["prompt_tokens"],
                "total_tokens": usage["total_tokens"],
            }
        else:  # LiteLLM's zeros, as below: shown, the record read them as the provider's
            doc.pop("usage", None)
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


def _finite(vector: list[Any]) -> list[Any]:
    """`vector` when each item is a finite number; raises `TypeError` otherwise. A
    provider's `NaN` or `Infinity` (or a number past float64's, read as infinite) is not
    JSON, but Python's parser, LiteLLM's, reads it, and orjson wrote it as `null`: the
    client got, and the record committed to, a vector the provider never sent."""
    if not all(type(v) is int or (type(v) is float and math.isfinite(v)) for v in vector):
        raise TypeError("an embedding holds an item that is not a finite number")
    return vector


def base64_embedding(vector: list[Any]) -> str:
    """`vector` as OpenAI's base64 encoding gives it: each number a little-endian
    float32. Raises `TypeError` for an item that is not a number (a bool is none) or one
    past float32's range (an answer that cannot be encoded: `encoded` makes it a
    protocol error)."""
    if not all(type(v) in (int, float) for v in vector):
        raise TypeError("an embedding holds an item that is not a number")
    try:
        floats = array.array("f", vector)
    except OverflowError:
        floats = array.array("f", [math.inf])
    if not all(math.isfinite(v) for v in floats):  # past float32's range: made infinite
        raise TypeError("an embedding holds a number past float32's range")
    if sys.byteorder == "big":
        floats.byteswap()
    return base64.b64encode(floats.tobytes()).decode("ascii")


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
    # A count the record could not hold (negative, past 2**53: a provider lying, or
    # past what orjson encodes, which failed the whole answer) is none: the usage is
    # neither relayed nor recorded.
    if not all(_count(v) for v in counts.values()) or not any(counts.values()):
        return None
    return {k: int(v) for k, v in counts.items() if v is not None}


def _count(value: Any) -> bool:
    """Whether `value` is a token count: an integer 0..2**53 (`type`, not `isinstance`:
    `true` is no count, though a bool is an int to Python)."""
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _usage_body(usage: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {k: usage[k] for k in _USAGE_COUNTS}
    for key, fields in _USAGE_DETAILS.items():
        detail = usage.get(key)
        if isinstance(detail, dict):
            kept = {f: detail[f] for f in fields if _count(detail.get(f))}
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
