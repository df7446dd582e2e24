"""Which answers of a backend's are relayed to a client as what they are: of a status
that is an answer with a body (`relayed_status`: a 2xx, not 204 or 205), as an event
stream, or JSON, in UTF-8 (`relayed_kind`). The gateway refuses any other
answer before its client sees a byte (gateway/api/answer_reads.py), and the `owngate
attest` sidecar countersigns no other (gateway/attest/app.py): one rule for both, so a
sidecar never signs, as a stream or at all, an answer the gateway would not relay.

The only header of a backend's that reaches the client is its content type (relayed on
a 2xx answer): a media type and its parameters, at most 256 visible ASCII bytes.
Longer, a client's HTTP parser may refuse the head (aiohttp past 8190 bytes a line,
Node's fetch past 16 KiB) and read no answer at all, while the record would state one
served. And only one its clients read as what the gateway read and recorded: an event
stream, or JSON in UTF-8. Under another type openai-node hands the caller a string,
the Python SDK in strict mode and aiohttp's `json()` raise, a browser renders
`text/html`; under another charset `requests` decodes the bytes into another text (or,
UTF-16, into no JSON at all).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["NO_BODY", "SSE", "UNRELAYABLE_TYPE", "is_sse", "relayed_kind", "relayed_status"]

SSE: Final = b"text/event-stream"
_JSON: Final = b"application/json"
_UTF8: Final = frozenset({b"utf-8", b"utf8"})
_TYPE_TEXT: Final = re.compile(rb"[\x20-\x7e\t]{1,256}")
UNRELAYABLE_TYPE: Final = (
    "a content-type header the gateway does not relay (over 256 bytes, not visible "
    "ASCII, neither application/json nor text/event-stream, or a charset other than UTF-8)"
)

# Statuses whose answer has no body whatever its headers say (RFC 9110): no OpenAI client
# reads a completion, a chat completion or embeddings out of one.
NO_BODY: Final = frozenset({204, 205, 304})


def relayed_status(status: int) -> bool:
    """Whether an answer of `status` is relayed to the client as the backend's answer: a
    2xx with a body. The gateway answers an error (400 and above) with its own error
    object, or tries another backend, and refuses a 204, 205 or 304 and any other 3xx
    (gateway/api/answer_reads.py `check_status`)."""
    return 200 <= status < 300 and status not in NO_BODY


def is_sse(content_type: bytes) -> bool:
    """Whether `content_type` names an event stream (a media type is case-insensitive:
    clients read `Text/Event-Stream` as one too)."""
    return content_type.partition(b";")[0].strip(b" \t").lower() == SSE


def relayed_kind(content_type: bytes) -> bool | None:
    """Whether an answer of `content_type` is relayed as an event stream (True) or as
    JSON (False); None for a type that is not relayed (above)."""
    media, *parameters = content_type.split(b";")
    media = media.strip(b" \t").lower()
    if (
        _TYPE_TEXT.fullmatch(content_type) is None
        or media not in (SSE, _JSON)
        or any(_charset(p) not in (None, *_UTF8) for p in parameters)
    ):
        return None
    return media == SSE


def _charset(parameter: bytes) -> bytes | None:
    """The charset a media type parameter names (lower case, unquoted); None for another."""
    name, _, value = parameter.partition(b"=")
    if name.strip(b" \t").lower() != b"charset":
        return None
    return value.strip(b" \t").strip(b'"').lower()
