"""A backend's error answer, in the gateway's own words.

A private backend's error response (or a hosted provider's error text) becomes the
gateway's OpenAI-format error: the status says which code the client gets
(`translate_upstream_error`), and the backend's own message is shown only after
`sanitize_upstream_message` took out what would tell the client about the deployment
(URLs, host:port pairs, the backend's host names, file paths), bounded to 300 characters, each
character that is not printable written as a space.
"""

from __future__ import annotations

import re

import orjson

from gateway.errors import ErrorCode, GatewayError

__all__ = ["sanitize_upstream_message", "translate_upstream_error"]

_URL = re.compile(r"\b(?:https?|wss?)://[^\s\"'<>]+", re.IGNORECASE)
_HOST_PORT = re.compile(
    # [IPv6]:port: an address has a colon, an index (`messages[0]`, the gateway's own
    # refusals name fields so) has none and stays
    r"\[[0-9a-fA-F.]*:[0-9a-fA-F:.]*\](?::\d+)?"
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"  # IPv4[:port]
    # name:port: the whole run of name characters before the colon, tried once per run
    # and never backtracked into. Tried at every `\b` of `a-a-a-...` and scanned to its
    # end from each, the search was quadratic (a 16 KB message held the event loop for
    # ~40 s; an error body is read up to 64 KiB).
    r"|(?<![\w.-])[\w.-]++:\d{1,5}\b"
    r"|\blocalhost\b"
)
# An absolute file path of two parts or more (`/models/llama/q4.gguf`, `/srv/app/x.py`): a
# model's file or a traceback's source on the backend's machine. Not `and/or`, nor a path
# inside a word; each part's run taken once (possessive), never backtracked into.
_PATH = re.compile(r"(?<![\w.~+-])(?:/[\w.~+-]++){2,}+/?")
_READ_CHARS = 2048


def sanitize_upstream_message(message: str, hosts: tuple[str, ...] = ()) -> str:
    """Strip URLs, host:port pairs and the backend's own host names from a backend's
    error text; bound its length."""
    if len(message) > _READ_CHARS:  # 300 are shown: the searches need not read 64 KiB
        head, space, _ = message[:_READ_CHARS].rpartition(" ")
        message = head if space else message[:_READ_CHARS]  # a word cut in half goes
    cleaned = _HOST_PORT.sub("[backend]", _URL.sub("[backend]", message))
    cleaned = _PATH.sub("[path]", cleaned)
    for host in hosts:
        cleaned = cleaned.replace(host, "[backend]")
    # What is not printable (line breaks, terminal escapes, bidi overrides) is a space.
    return "".join(c if c.isprintable() else " " for c in cleaned[:300])


def translate_upstream_error(status: int, data: bytes, hosts: tuple[str, ...] = ()) -> GatewayError:
    """Turn a backend's error response into the gateway's own OpenAI error."""
    detail = sanitize_upstream_message(_upstream_message(data), hosts)
    suffix = f": {detail}" if detail else ""
    if status in (400, 413, 422):
        return GatewayError(
            ErrorCode.upstream_bad_request, f"the backend rejected the request{suffix}"
        )
    if status in (401, 403):
        return GatewayError(
            ErrorCode.upstream_error,
            "the backend refused the gateway's credentials (check the backend's api_key)",
        )
    if status in (429, 503):
        return GatewayError(
            ErrorCode.backend_unavailable, f"the backend is overloaded or not ready{suffix}"
        )
    if status in (408, 504):
        return GatewayError(ErrorCode.upstream_timeout, "the backend timed out")
    return GatewayError(ErrorCode.upstream_error, f"the backend failed (HTTP {status}){suffix}")


def _upstream_message(data: bytes) -> str:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ""
    if isinstance(doc, dict):
        error = doc.get("error", doc.get("detail", doc.get("message")))
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str):
            return error
    return ""
