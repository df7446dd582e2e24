"""The budget for whole answers (`limits.max_held_answer_bytes`): its config bound and
what a refusal says (gateway/api/answer_reads.py `cover_answer`)."""

from __future__ import annotations

import pydantic
import pytest

from gateway.api.answer_reads import cover_answer
from gateway.body_budget import BodyBudget
from gateway.config.schema import LimitSettings
from gateway.errors import ErrorCode, GatewayError


def test_one_answer_within_its_limit_must_fit_the_budget() -> None:
    with pytest.raises(pydantic.ValidationError, match="max_held_answer_bytes"):
        LimitSettings(max_response_bytes=1024, max_held_answer_bytes=1023)
    assert LimitSettings(max_response_bytes=1024, max_held_answer_bytes=1024)
    defaults = LimitSettings()
    assert defaults.max_held_answer_bytes == 1024 * 1024 * 1024
    assert defaults.max_held_answer_bytes >= defaults.max_response_bytes


def test_an_answer_past_the_budget_is_a_wait_naming_the_answer_budget() -> None:
    budget = BodyBudget()
    first, second = budget.hold(100), budget.hold(100)
    cover_answer(first, 60)
    with pytest.raises(GatewayError) as refused:
        cover_answer(second, 41)
    error = refused.value
    assert error.code is ErrorCode.rate_limit_exceeded and error.status == 429
    assert (b"retry-after", b"1") in error.headers
    assert "limits.max_held_answer_bytes" in error.message
    assert "request bod" not in error.message  # not the request body budget's words
    assert budget.held == 60 and second.size == 0


def test_an_answer_past_the_whole_budget_is_the_backends_502_not_a_413() -> None:
    budget = BodyBudget()
    held = budget.hold(100)
    with pytest.raises(GatewayError) as refused:
        cover_answer(held, 101)
    assert refused.value.code is ErrorCode.upstream_error and refused.value.status == 502
    assert budget.held == 0


def test_one_tenants_answers_hold_at_most_its_part_naming_it() -> None:
    """Past its tenant's part, with the budget still free for others: a wait (429) that
    names the per-tenant setting, in the answer budget's words; the other tenant's part
    is whole."""
    budget = BodyBudget()
    a1, a2, b = (budget.hold(100, t, 50) for t in ("a", "a", "b"))
    cover_answer(a1, 30)
    with pytest.raises(GatewayError) as refused:
        cover_answer(a2, 21)
    error = refused.value
    assert error.code is ErrorCode.rate_limit_exceeded and (b"retry-after", b"1") in error.headers
    assert "limits.max_held_answer_bytes_per_tenant" in error.message
    assert "request bod" not in error.message
    assert budget.held == 30 and a2.size == 0
    cover_answer(b, 50)
    assert budget.by_tenant == {"a": 30, "b": 50}
    for held in (a1, a2, b):
        held.release()
    assert budget.held == 0 and budget.by_tenant == {}


def test_a_tenants_part_of_the_answers_is_half_unless_set_and_holds_one_answer() -> None:
    assert LimitSettings().tenant_held_answer_bytes == 512 * 1024 * 1024
    small = LimitSettings(max_response_bytes=1000, max_held_answer_bytes=1500)
    assert small.tenant_held_answer_bytes == 1000  # one answer's bytes at least
    whole = LimitSettings(max_held_answer_bytes_per_tenant=2**30)
    assert whole.tenant_held_answer_bytes == 2**30  # the former behaviour
    with pytest.raises(pydantic.ValidationError, match="max_held_answer_bytes_per_tenant"):
        LimitSettings(max_response_bytes=1024, max_held_answer_bytes_per_tenant=1023)
    with pytest.raises(pydantic.ValidationError, match="max_held_answer_bytes_per_tenant"):
        LimitSettings(max_held_answer_bytes_per_tenant=2**30 + 1)
