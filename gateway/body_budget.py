"""Request bodies held at once, per process: one budget across every tenant's requests.

`limits.max_body_bytes` bounds one request body; the gateway holds each body, and what is
parsed from it, until its request ends, through retries and a stream's whole relay. With
`listen.max_connections` connections each sending a body just under the limit, the bytes
alone would be 4,096 x 8 MiB = 32 GiB by default, and a body of tiny values (`[{},{},...]`)
parses into up to about 32 times its size. `BodyBudget` bounds the sum: a request
reserves its declared `content-length` before any of its body is read (a chunked body:
its bytes as they arrive); once the body is whole and before it is parsed, the gateway
grows the reservation to an upper bound of what the request will hold for it
(`gateway.api.body.held_bound`: the body, a rewritten copy, the parsed document). All of
it is given back when the request ends. A reservation that would take the process past
`limits.max_held_body_bytes` is refused with 429 `rate_limit_exceeded` and
`retry-after: 1`, before more of the body is read or any of it parsed; a client retries
it as it retries a rate limit. One larger than the whole budget could never be taken:
413 `request_too_large`. One tenant's requests may hold at most their part of it
(`limits.max_held_body_bytes_per_tenant`, half by default; 429 past it, 413 for one
body larger than it), so that one tenant's bodies, held open or of tiny values held
through a long answer, cannot have every other tenant refused.

The gateway uses a second one for the whole answers (and backend error bodies) it holds
(`limits.max_held_answer_bytes`, gateway/api/answer_reads.py), with a part per tenant
as well (`limits.max_held_answer_bytes_per_tenant`). The attest sidecar
(`owngate attest`) uses the same budget for bytes only: it hashes and relays bodies and
never parses them; and a second one for the whole answers it holds
(`--max-held-answer-bytes`, gateway/attest/app.py); `hold_answer` words its refusals
for both.
"""

from __future__ import annotations

from typing import Final, Literal

from gateway.errors import ErrorCode, GatewayError

__all__ = ["BodyBudget", "Held", "Refusal", "held_for_characters", "hold_answer"]

RETRY_AFTER: Final = (b"retry-after", b"1")
# Why a reservation was not taken (`Held.take`).
Refusal = Literal["too_large", "too_large_for_tenant", "full", "tenant_full"]


def held_for_characters(size: int, *, plain: bool = False) -> int:
    """What `gateway.api.body.held_bound` reserves for a `size`-byte body apart from its
    JSON values: the body, one rewritten copy, and the parsed strings' characters, 1 byte
    each for a `plain` body (ASCII without escapes), else up to 4. Six times `size` at
    most; each `{`, `[` or `,` adds `PER_VALUE` (320) bytes on top."""
    return size * (2 + (1 if plain else 4))


class BodyBudget:
    """Bytes of request bodies reserved now by this process's requests, in all and per
    tenant (`by_tenant`: tenants holding some now)."""

    __slots__ = ("by_tenant", "held")

    def __init__(self) -> None:
        self.held = 0
        self.by_tenant: dict[str, int] = {}

    def hold(self, limit: int, tenant: str | None = None, tenant_limit: int = 0) -> Held:
        """A reservation of nothing yet, for one request, under `limit` bytes in all and,
        for a `tenant`'s request, under `tenant_limit` bytes of that tenant's requests."""
        return Held(self, limit, tenant, tenant_limit)


class Held:
    """One request's share of a `BodyBudget`: grows with its body, released once."""

    __slots__ = ("_budget", "_limit", "_tenant", "_tenant_limit", "size")

    def __init__(
        self, budget: BodyBudget, limit: int, tenant: str | None = None, tenant_limit: int = 0
    ) -> None:
        self._budget = budget
        self._limit = limit
        self._tenant = tenant
        self._tenant_limit = min(tenant_limit, limit) if tenant is not None else limit
        self.size = 0

    def cover(self, size: int) -> None:
        """Hold at least `size` bytes; raises `GatewayError`: 429 past the budget or the
        tenant's part of it, 413 past all of that (no retry could succeed)."""
        refused = self.take(size)
        if refused in ("too_large", "too_large_for_tenant"):  # retrying cannot help
            setting = "max_held_body_bytes" if refused == "too_large" else _PER_TENANT
            raise GatewayError(
                ErrorCode.request_too_large,
                "The request body would take more memory, once parsed, than the gateway "
                f"may hold for request bodies (limits.{setting}); send a smaller one.",
            )
        if refused == "full":
            raise GatewayError(
                ErrorCode.rate_limit_exceeded,
                "The gateway holds as many request bodies as it may at once "
                "(limits.max_held_body_bytes); retry shortly.",
                headers=(RETRY_AFTER,),
            )
        if refused == "tenant_full":
            raise GatewayError(
                ErrorCode.rate_limit_exceeded,
                "Your requests hold as many request bodies as one tenant's may at once "
                f"(limits.{_PER_TENANT}); retry shortly.",
                headers=(RETRY_AFTER,),
            )

    def take(self, size: int) -> Refusal | None:
        """Hold at least `size` bytes if they fit, else take nothing and say why not:
        larger than the whole budget or than the tenant's part of it (`too_large`,
        `too_large_for_tenant`: no retry could succeed), or past what is free now of the
        budget (`full`) or of the tenant's part (`tenant_full`)."""
        more = size - self.size
        if more <= 0:
            return None
        if size > self._tenant_limit:
            whole = self._tenant is None or size > self._limit
            return "too_large" if whole else "too_large_for_tenant"
        budget, tenant = self._budget, self._tenant
        if budget.held + more > self._limit:
            return "full"
        if tenant is not None:
            mine = budget.by_tenant.get(tenant, 0)
            if mine + more > self._tenant_limit:
                return "tenant_full"
            budget.by_tenant[tenant] = mine + more
        budget.held += more
        self.size = size
        return None

    def release(self) -> None:
        """Give the bytes back (again: nothing)."""
        budget, tenant = self._budget, self._tenant
        budget.held -= self.size
        if tenant is not None and self.size:
            left = budget.by_tenant.get(tenant, 0) - self.size
            if left > 0:
                budget.by_tenant[tenant] = left
            else:
                budget.by_tenant.pop(tenant, None)  # no entry per tenant ever seen
        self.size = 0


_PER_TENANT: Final = "max_held_body_bytes_per_tenant"


def hold_answer(
    held: Held, size: int, *, holder: str, setting: str, tenant_setting: str = ""
) -> None:
    """Hold `size` bytes of a backend's whole answer: 429 `rate_limit_exceeded` with
    `retry-after: 1` past the budget or the tenant's part of it (another answer may have
    been given back by then), 502 `upstream_error` past all of it (no retry could help).
    `holder` (the gateway, the sidecar) and `setting` (the limit that bounds it; its
    per-tenant part `tenant_setting`, for a tenant's request) are named in the message."""
    refused = held.take(size)
    if refused == "full":
        raise GatewayError(
            ErrorCode.rate_limit_exceeded,
            f"The {holder} holds as many whole answers as it may at once ({setting}); "
            "retry shortly.",
            headers=(RETRY_AFTER,),
        )
    if refused == "tenant_full":
        raise GatewayError(
            ErrorCode.rate_limit_exceeded,
            "Your requests hold as many whole answers as one tenant's may at once "
            f"({tenant_setting}); retry shortly.",
            headers=(RETRY_AFTER,),
        )
    if refused is not None:
        whole = refused == "too_large"
        raise GatewayError(
            ErrorCode.upstream_error,
            "The backend's answer is larger than the "
            f"{holder} may hold ({setting if whole else tenant_setting}).",
        )
