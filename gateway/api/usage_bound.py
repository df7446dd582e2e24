"""The most tokens one answer may be charged: what its request and its bytes justify.

A backend's `usage` is its own word. A hostile or broken one could report 2**53 tokens
and put the tenant's tokens-per-minute budget 30 days in debt (the ledger's cap). So the
tenant is charged the reported usage only up to a bound the request itself justifies:

    bound = prompt bound + completion bound            (at most 2**53)
    prompt bound     = request body bytes + PROMPT_ALLOWANCE
                       + MEDIA_ALLOWANCE per non-text content part of a chat message
    completion bound = answer bytes + choices * COMPLETION_ALLOWANCE
                       or, when the client set a limit (the larger of max_tokens,
                       max_completion_tokens), answer bytes + choices * limit when
                       that is less
    choices          = the larger of n and best_of (1 when neither is set), times
                       the prompts of a text completion's batch (`prompt` an array of
                       strings or of token arrays: one answer per prompt each)

Why each term holds for an honest backend: a prompt token is at least one byte of the
text the client sent (JSON escapes only add bytes), plus what the backend adds that the
body does not carry: a chat template's role markers and default system prompt
(`PROMPT_ALLOWANCE`), and an image, audio or video part that it fetches or decodes into
many tokens from a short URL or a small file (`MEDIA_ALLOWANCE` each). An output token is
at least one byte of the answer relayed (a whole answer's body, or a stream's relayed
bytes), except tokens that leave no text: end-of-sequence and other special tokens, and a
hosted reasoning model's hidden reasoning (`COMPLETION_ALLOWANCE` per choice, or the
client's limit per choice when less). The limit bounds only those: the answer's bytes
count whatever the limit, since a backend may read another field over it (llama.cpp's
`n_predict` wins over `max_tokens`: `{"max_tokens": 1, "n_predict": -1}` generated
without end and was charged one output token).

What the bound does not know: a media part that becomes more than `MEDIA_ALLOWANCE`
tokens (a long video), or hidden reasoning past `COMPLETION_ALLOWANCE` without a limit
set, is charged the bound; the completion record then says so (`usage_bound`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.canonical import MAX_SAFE_INTEGER

__all__ = [
    "COMPLETION_ALLOWANCE",
    "MEDIA_ALLOWANCE",
    "PROMPT_ALLOWANCE",
    "completion_bound",
    "over_bound",
    "prompt_bound",
    "tokens_bound",
]

PROMPT_ALLOWANCE: Final = 4096  # chat template, default system prompt, special tokens
MEDIA_ALLOWANCE: Final = 65536  # per image, audio, video or file part
COMPLETION_ALLOWANCE: Final = 131072  # per choice: tokens that leave no bytes
_MEDIA_COUNTED: Final = 4096  # parts looked at per request (a bound on the walk itself)


def prompt_bound(ask: Mapping[str, Any] | None, body_bytes: int) -> int:
    """The most prompt tokens a request of `body_bytes` bytes justifies."""
    return body_bytes + PROMPT_ALLOWANCE + MEDIA_ALLOWANCE * _media_parts(ask)


def completion_bound(ask: Mapping[str, Any] | None, answer_bytes: int) -> int:
    """The most output tokens an answer of `answer_bytes` bytes to `ask` justifies."""
    choices = max(1, _count(ask, "n"), _count(ask, "best_of")) * _prompts(ask)
    limit = max(_count(ask, name, -1) for name in ("max_tokens", "max_completion_tokens"))
    no_text = COMPLETION_ALLOWANCE if limit < 0 else min(COMPLETION_ALLOWANCE, limit)
    return answer_bytes + choices * no_text


def tokens_bound(ask: Mapping[str, Any] | None, body_bytes: int, answer_bytes: int) -> int:
    """The most tokens (prompt and output) one answer may be charged."""
    total = prompt_bound(ask, body_bytes) + completion_bound(ask, answer_bytes)
    return min(total, MAX_SAFE_INTEGER)


def over_bound(
    reported: int, ask: Mapping[str, Any] | None, body_bytes: int, answer_bytes: int
) -> int | None:
    """`tokens_bound` when `reported` exceeds it, else None. The request's content parts
    are counted only when the reported tokens exceed the bound without them (rarely: an
    honest answer stays under it), so the hot path walks no messages."""
    without_media = body_bytes + PROMPT_ALLOWANCE + completion_bound(ask, answer_bytes)
    if reported <= without_media:
        return None
    bound = tokens_bound(ask, body_bytes, answer_bytes)
    return bound if reported > bound else None


def _count(ask: Mapping[str, Any] | None, name: str, absent: int = 0) -> int:
    """A whole-number request field, `absent` when it is missing or not one (a bool is no
    number here, though Python makes it an int)."""
    value = None if ask is None else ask.get(name)
    return value if type(value) is int and value >= 0 else absent


def _prompts(ask: Mapping[str, Any] | None) -> int:
    """The prompts of a text completion: an array holding anything but token ids is a
    batch, each entry answered on its own (at most its length: a backend refuses the
    rest); one otherwise (a string, or one prompt's token ids)."""
    prompt = None if ask is None else ask.get("prompt")
    if not isinstance(prompt, list) or all(type(p) is int for p in prompt):
        return 1
    return len(prompt)


def _media_parts(ask: Mapping[str, Any] | None) -> int:
    """Content parts of chat messages that are not text (at most `_MEDIA_COUNTED`)."""
    messages = None if ask is None else ask.get("messages")
    if not isinstance(messages, list):
        return 0
    found = seen = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            seen += 1
            if seen > _MEDIA_COUNTED:
                return found
            if isinstance(part, dict) and part.get("type") not in ("text", None):
                found += 1
    return found
