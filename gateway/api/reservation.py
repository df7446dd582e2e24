"""What a request reserves of its tenant's tokens-per-minute budget before dispatch.

A tenant's token budget is charged when an answer ends (the usage, gateway/api/trail.py),
too late to stop a burst: every request of it would be admitted while the budget still
looked full. So once the body is parsed, before any backend sees the prompt, the request
reserves what it may use (`Admission.reserve`, gateway/state/ledger.py), and the 429
comes when that does not fit what is left of the minute's budget:

    reservation = prompt estimate + choices * answer allowance      (at most the budget)
    prompt estimate  = token ids + media parts * media allowance
                       + the other body bytes / 4, rounded up
    token ids        = the whole numbers of `prompt` (a completion's), `input` (an
                       embedding's) and `content` (llama.cpp's embeddings read it when
                       there is no `input`, token ids included), and of the arrays they
                       hold: a prompt given as token ids is exactly that many tokens
                       (the digits of the numbers are left out of the bytes / 4; their
                       separators still count there, a quarter token each)
    media parts      = the image, audio, video and file parts of chat messages and the
                       items of their `images`, the items of llama.cpp's
                       `multimodal_data` (in `prompt`, `input` or `content`), the `image`
                       and `video` of SGLang's embedding input objects, the `input`
                       strings of an Infinity embedding of media (`modality` not text)
                       and the strings of vLLM's `mm_payload`
                       (`usage_bound.counted_media`, counted once per request,
                       the parts the usage bound allows `MEDIA_ALLOWANCE` tokens each)
    media allowance  = the tenant's `limits.reserved_tokens_per_media`, by default
                       `MEDIA_RESERVED` (4096: a photo as most vision models tokenize it;
                       a larger image, a long audio clip or a video may use more)
    choices          = `usage_bound.answer_choices`: n, best_of, n_cmpl, times a text
                       completion's prompts
    answer allowance = the client's limit (`usage_bound.answer_limit`: max_tokens,
                       max_completion_tokens, as every backend reads them); without one,
                       the tenant's `limits.reserved_tokens_per_answer`, by default an
                       eighth of `tokens_per_minute`, at most `COMPLETION_ALLOWANCE`
                       (eight such requests at once on a full budget, or
                       `tokens_per_minute / COMPLETION_ALLOWANCE` above 1,048,576)
    embeddings       = the prompt estimate alone (an embedding has no answer tokens)

The estimate is not a bound: text is one token per 4 bytes for most text and tokenizers,
but up to one per byte (byte-fallback: rare scripts, random bytes), and a media part may
be tokenized past its allowance (up to `MEDIA_ALLOWANCE`, which the usage bound charges).
What a request uses past its reservation is charged when it ends (the tenant waits out
the debt); a burst admitted at once can use up to about four times its text estimate.

When the request ends its reservation is replaced by the tokens charged: a refund when
it used less (all of it when no backend took the prompt), an extra charge when more.

A request whose client limit alone (choices * max_tokens) exceeds the whole per-minute
budget can never fit: it is refused at once with 429 `rate_limit_exceeded`, type
`tokens`, naming the limit and what was asked, and no `retry-after` (as OpenAI answers
a request too large for its tokens-per-minute limit). Under `serve --workers N` with
`state: memory` the budget it must fit is the worker's part (`Admission.request_budget`):
cut to the part instead, each worker admitted one on a full part, N such requests in a
minute where one process admits one (2 of 400 tokens each through a 600 budget). A
reservation over the budget otherwise (a long prompt, many choices without a limit) is
cut to the whole budget: it waits for a full budget, and its usage past that is charged
when it ends. A request refused here keeps the request its admission charged of
`requests_per_minute` (its body was read and parsed; OpenAI counts failed requests
against the per-minute limit too): only requests and tokens a refusal at admission keeps
out cost nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.api.usage_bound import (
    COMPLETION_ALLOWANCE,
    answer_choices,
    answer_limit,
    media_parts,
)
from gateway.errors import ErrorCode, GatewayError
from gateway.state import Admission, RateLimited
from gateway.tenants import TenantEntry

__all__ = [
    "DEFAULT_ANSWER_SHARE",
    "MEDIA_RESERVED",
    "default_per_answer",
    "prompt_estimate",
    "rate_limited",
    "reserve_tokens",
    "tokens_to_reserve",
]

DEFAULT_ANSWER_SHARE: Final = 8  # without a client limit: tokens_per_minute / 8 per answer
MEDIA_RESERVED: Final = 4096  # per media part, by default (limits.reserved_tokens_per_media)
# Token ids of at most this many digits have their digits left out of the bytes / 4 (a
# longer number is no token id; it is left in the estimate: counting its digits is
# quadratic).
_ID_DIGITS: Final = 18
_ID_CEILING: Final = 10**_ID_DIGITS


def tokens_to_reserve(
    ask: Mapping[str, Any],
    body_bytes: int,
    *,
    per_minute: int,
    per_answer: int | None,
    per_media: int | None = None,
    embeddings: bool = False,
    fits: int | None = None,
    media: int | None = None,
) -> int:
    """What the request reserves (before it is cut to the budget). Raises `GatewayError`
    (429) when the client's own limit alone exceeds `fits` (by default `per_minute`; a
    worker's part of it under `serve --workers N` with `state: memory`). `media`: the
    request's `counted_media` (counted here when None)."""
    per_media = per_media or MEDIA_RESERVED
    prompt = prompt_estimate(ask, body_bytes, per_media=per_media, media=media)
    if embeddings:
        return prompt
    choices = answer_choices(ask)
    limit = answer_limit(ask)
    budget = per_minute if fits is None else fits
    if limit is not None and choices * limit > budget:
        part = "" if budget == per_minute else f" (this process's part of {per_minute})"
        raise GatewayError(
            ErrorCode.rate_limit_exceeded,
            f"Request too large on tokens per min (TPM): Limit {budget}{part}, Requested "
            f"{choices * limit} for the answers alone (max_tokens times the choices). "
            "Lower max_tokens (or n) to run it.",
            error_type="tokens",
        )
    if limit is None:
        limit = per_answer or default_per_answer(per_minute)
    return prompt + choices * limit


# Where a backend reads a prompt as token ids: llama.cpp's `/v1/embeddings` reads
# `{"content": [1, 1, ...]}` (commit 7e4c0a9: one token an id) when there is no `input`, and
# such ids were reserved at bytes / 4, half a token each.
_ID_FIELDS: Final = ("prompt", "input", "content")


def prompt_estimate(
    ask: Mapping[str, Any], body_bytes: int, *, per_media: int, media: int | None = None
) -> int:
    """The prompt tokens a request is reserved for: its token ids exactly, `per_media`
    per media part (`media` of them, counted here when None), and one token per 4 of the
    body's other bytes."""
    ids = id_bytes = 0
    for field in _ID_FIELDS:
        count, width = _token_ids(ask.get(field))
        ids += count
        id_bytes += width
    text = max(0, body_bytes - id_bytes)
    media = media_parts(ask) if media is None else media
    return -(-text // 4) + ids + per_media * media


def _token_ids(prompt: Any) -> tuple[int, int]:
    """The token ids of a `prompt` or `input` (an array of whole numbers, or an array
    holding such arrays, llama.cpp's mixed arrays included) and the bytes their digits
    take in the body."""
    if not isinstance(prompt, list):
        return 0, 0
    count = width = 0
    for item in prompt:
        for token in item if isinstance(item, list) else (item,):
            if type(token) is int:
                count += 1
                if 0 <= token < _ID_CEILING:
                    width += len(str(token))
    return count, width


def default_per_answer(per_minute: int) -> int:
    """Tokens reserved per answer of a request that sets no limit, by default."""
    return max(1, min(-(-per_minute // DEFAULT_ANSWER_SHARE), COMPLETION_ALLOWANCE))


async def reserve_tokens(
    admission: Admission,
    tenant: TenantEntry,
    ask: Mapping[str, Any],
    body_bytes: int,
    media: int | None = None,
    *,
    embeddings: bool,
) -> None:
    """Reserve the request's tokens on its admission, or raise `GatewayError` (429; the
    admission's request stays charged). The budget is the admission's (a reload while the
    body arrived changes later requests')."""
    per_minute = admission.limits.tokens_per_minute
    if per_minute is None:
        return
    tokens = tokens_to_reserve(
        ask,
        body_bytes,
        per_minute=per_minute,
        per_answer=tenant.reserved_tokens_per_answer,
        per_media=tenant.reserved_tokens_per_media,
        embeddings=embeddings,
        fits=admission.request_budget,
        media=media,
    )
    try:
        await admission.reserve(min(tokens, per_minute))
    except RateLimited as exc:
        raise rate_limited(exc) from exc


def rate_limited(exc: RateLimited) -> GatewayError:
    """The 429 a client gets for `exc`, with its `retry-after`."""
    return GatewayError(
        ErrorCode.rate_limit_exceeded,
        exc.message,
        headers=((b"retry-after", exc.retry_after_header),),
        error_type=exc.error_type,
    )
