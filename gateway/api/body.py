"""The request body: parsed once, the byte-exact `model` rewrite for aliases, and the
request for stream usage the gateway adds when it needs the counts."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from gateway.errors import ErrorCode, GatewayError

__all__ = ["ask_for_usage", "model_pattern", "parse_body", "rewrite_model"]

_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(
            ErrorCode.invalid_json,
            f"We could not parse the JSON body of your request ({exc.args[0]}).",
        ) from exc
    if not isinstance(doc, dict):
        raise GatewayError(ErrorCode.invalid_request, "the request body must be a JSON object")
    if body.count(b'"model"') > 1 and _repeats_model_key(body):
        # The gateway routes on one value; a backend could read the other.
        raise GatewayError(
            ErrorCode.invalid_request, "the request body repeats the `model` key", param="model"
        )
    return doc


def _repeats_model_key(body: bytes) -> bool:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if sum(1 for key, _ in items if key == "model") > 1:
            raise ValueError("repeated model key")
        return dict(items)

    try:
        json.loads(body, object_pairs_hook=pairs)
    except ValueError:
        return True
    return False


def model_pattern(model: str) -> re.Pattern[bytes]:
    return re.compile(rb'("model"\s*:\s*)' + re.escape(orjson.dumps(model)))


def rewrite_model(
    body: bytes, doc: dict[str, Any], pattern: re.Pattern[bytes], upstream_model: str
) -> bytes:
    """Replace the top-level `model` value, touching no other byte when that is certain.

    The byte-level splice is used only when the pattern matches exactly once and the
    result, parsed again, has the new name at the top level; otherwise (escaped names,
    the same pair nested elsewhere) the document is re-encoded.
    """
    if len(pattern.findall(body)) == 1:
        out = pattern.sub(lambda m: m.group(1) + orjson.dumps(upstream_model), body, count=1)
        if orjson.loads(out).get("model") == upstream_model:
            return out
    return orjson.dumps({**doc, "model": upstream_model})


def ask_for_usage(body: bytes, doc: dict[str, Any]) -> bytes:
    """`body` (the JSON object `doc`, but for a renamed `model`) with
    `stream_options.include_usage` set to true.

    Without a `stream_options` key in the document, the field is spliced in after the
    opening brace and no other byte changes; otherwise (the client set other stream
    options, or asked for no usage) the body is re-encoded with the option merged in.
    """
    if "stream_options" not in doc:
        start = body.index(b"{") + 1  # the object's first byte (JSON allows whitespace)
        return body[:start] + _INCLUDE_USAGE + body[start:]
    current = orjson.loads(body)
    options = current.get("stream_options")
    merged = {**options, "include_usage": True} if isinstance(options, dict) else {}
    return orjson.dumps({**current, "stream_options": merged or {"include_usage": True}})
