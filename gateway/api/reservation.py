"""What a request reserves of its tenant's tokens-per-minute budget before dispatch.

A tenant's token budget is charged when an answer ends (the usage, gateway/api/trail.py),
too late to stop a burst: every request of it would be admitted while the budget still
looked full. So once the body is parsed, before any backend sees the prompt, the request
reserves what it may use (`Admission.reserve`, gateway/state/ledger.py), and the 429
comes when that does not fit what is left of the minute's budget:

    reservation = prompt estimate + choices * answer allowance      (at most the budget)
    prompt estimate  = request body bytes / 4, rounded up (the estimate the budget is
                       charged for an answer without usage)
    choices          = `usage_bound.answer_choices`: n, best_of, n_cmpl, times a text
                       completion's prompts
    answer allowance = the client's limit (`usage_bound.answer_limit`: max_tokens,
                       max_completion_tokens, as every backend reads them); without one,
                       the tenant's `limits.reserved_tokens_per_answer`, by default an
                       eighth of `tokens_per_minute` (at most `COMPLETION_ALLOWANCE`):
                       eight such requests at once on a full budget
    embeddings       = the prompt estimate alone (an embedding has no answer tokens)

When the request ends its reservation is replaced by the tokens charged: a refund when
it used less (all of it when no backend took the prompt), an extra charge when more.

A request whose client limit alone (choices * max_tokens) exceeds the whole per-minute
budget can never fit: it is refused at once with 429 `rate_limit_exceeded`, type
`tokens`, naming the limit and what was asked, and no `retry-after` (as OpenAI answers
a request too large for its tokens-per-minute limit). A reservation over the budget
otherwise (a long prompt, many choices without a limit) is cut to the whole budget: it
waits for a full budget, and its usage past that is charged when it ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.api.usage_bound import COMPLETION_ALLOWANCE, answer_choices, answer_limit
from gateway.errors import ErrorCode, GatewayError
from gateway.state import Admission, RateLimited
from gateway.tenants import TenantEntry

__all__ = [
    "DEFAULT_ANSWER_SHARE",
    "default_per_answer",
    "rate_limited",
    "reserve_tokens",
    "tokens_to_reserve",
]

DEFAULT_ANSWER_SHARE: Final = 8  # without a client limit: tokens_per_minute / 8 per answer


def tokens_to_reserve(
    ask: Mapping[str, Any],
    body_bytes: int,
    *,
    per_minute: int,
    per_answer: int | None,
    embeddings: bool = False,
) -> int:
    """What the request reserves (before it is cut to the budget). Raises `GatewayError`
    (429) when the client's own limit alone exceeds `per_minute`."""
    prompt = -(-body_bytes // 4)
    if embeddings:
        return prompt
    choices = answer_choices(ask)
    limit = answer_limit(ask)
    if limit is not None and choices * limit > per_minute:
        raise GatewayError(
            ErrorCode.rate_limit_exceeded,
            f"Request too large on tokens per min (TPM): Limit {per_minute}, Requested "
            f"{choices * limit} for the answers alone (max_tokens times the choices). "
            "Lower max_tokens (or n) to run it.",
            error_type="tokens",
        )
    if limit is None:
        limit = per_answer or default_per_answer(per_minute)
    return prompt + choices * limit


def default_per_answer(per_minute: int) -> int:
    """Tokens reserved per answer of a request that sets no limit, by default."""
    return max(1, min(-(-per_minute // DEFAULT_ANSWER_SHARE), COMPLETION_ALLOWANCE))


async def reserve_tokens(
    admission: Admission,
    tenant: TenantEntry,
    ask: Mapping[str, Any],
    body_bytes: int,
    *,
    embeddings: bool,
) -> None:
    """Reserve the request's tokens on its admission, or raise `GatewayError` (429). The
    budget is the admission's (a reload while the body arrived changes later requests')."""
    per_minute = admission.limits.tokens_per_minute
    if per_minute is None:
        return
    tokens = tokens_to_reserve(
        ask,
        body_bytes,
        per_minute=per_minute,
        per_answer=tenant.reserved_tokens_per_answer,
        embeddings=embeddings,
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
