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
