"""A request refused at its token reservation costs the request its admission charged of
`requests_per_minute` (docs/state.md): by then its body was read and parsed, so the
requests limit is what bounds how many bodies a tenant has the gateway read a minute.

Found by review: a refused reservation gave its request back (`Admission.refuse`), and
500 bodies of `max_tokens: 10**6` (which never fit) were admitted under a limit of 2."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.api.reservation import reserve_tokens
from gateway.errors import GatewayError
from gateway.state import RateLimited, TenantLimits
from gateway.state.memory import MemoryState
from gateway.tenants import TenantEntry

LIMITS = TenantLimits(requests_per_minute=2, tokens_per_minute=1000)
TENANT = TenantEntry("acme", False, frozenset(), LIMITS)
BODY_BYTES = 1_000_000  # what the gateway read and parsed of each
TRIES = 500


async def _admitted_while_refused(ask: dict[str, Any], state: MemoryState) -> int:
    """How many of `TRIES` requests, each refused at its reservation, are admitted."""
    admitted = 0
    for _ in range(TRIES):
        try:
            admission = await state.acquire("acme", LIMITS)
        except RateLimited as exc:
            limit = exc.limit
            break
        admitted += 1
        try:
            with pytest.raises(GatewayError) as refused:
                await reserve_tokens(admission, TENANT, ask, BODY_BYTES, embeddings=False)
            assert refused.value.status == 429
        finally:
            await admission.release(0)
    else:
        limit = None
    assert limit == "requests_per_minute"
    return admitted


def test_requests_refused_as_never_fitting_count_against_the_requests_limit() -> None:
    state = MemoryState(clock=lambda: 100.0)  # time stands still: nothing refills
    admitted = asyncio.run(_admitted_while_refused({"max_tokens": 10**6}, state))
    assert admitted == 2, f"{admitted} bodies read and parsed under requests_per_minute=2"
    assert state.tenant_use("acme", LIMITS).requests == 2


def test_requests_refused_as_not_fitting_now_count_against_the_requests_limit() -> None:
    state = MemoryState(clock=lambda: 100.0)

    async def scenario() -> int:
        holder = await state.acquire("acme", LIMITS)  # 1 of 2: holds most of the budget
        await holder.reserve(990)  # some is left: later admissions pass, their bodies read
        try:
            return await _admitted_while_refused({"max_tokens": 10}, state)
        finally:
            await holder.release(0)

    admitted = asyncio.run(scenario())
    assert admitted == 1, f"{admitted + 1} bodies read and parsed under requests_per_minute=2"
    assert state.tenant_use("acme", LIMITS).requests == 2
