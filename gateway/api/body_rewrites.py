"""A request body's rewrites: the byte-exact `model` rewrite for aliases, and the request
for stream usage the gateway adds when it needs the counts.

Each touches no other byte of the client's body where that is certain, and otherwise
re-encodes the document gateway/api/body.py parsed (which refused what a re-encoding
would change: repeats of the fields it reads, integers outside the 64-bit range).
"""

from __future__ import annotations

__all__ = ["ask_for_usage", "model_pattern", "rewrite_model"]

import re
from typing import Any

import orjson

from gateway.json_loads import loads

_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'


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
        if loads(out).get("model") == upstream_model:
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
    current = loads(body)
    options = current.get("stream_options")
    merged = {**options, "include_usage": True} if isinstance(options, dict) else {}
    return orjson.dumps({**current, "stream_options": merged or {"include_usage": True}})
