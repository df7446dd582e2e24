"""`BodyBudget`: the request bodies one process holds at once, across requests."""

from __future__ import annotations

import pydantic
import pytest

from gateway.body_budget import BodyBudget
from gateway.config.schema import LimitSettings
from gateway.errors import ErrorCode, GatewayError


def test_holds_share_one_budget_and_give_it_back() -> None:
    budget = BodyBudget()
    first, second = budget.hold(100), budget.hold(100)
    first.cover(60)
    first.cover(40)  # already covered: nothing more
    assert budget.held == 60
    with pytest.raises(GatewayError) as refused:
        second.cover(41)
    assert refused.value.code is ErrorCode.rate_limit_exceeded and refused.value.status == 429
    assert (b"retry-after", b"1") in refused.value.headers
    assert budget.held == 60 and second.size == 0  # a refusal takes nothing
    second.cover(40)
    first.release()
    first.release()  # once only
    assert budget.held == 40
    second.cover(100)
    assert budget.held == 100
    second.release()
    assert budget.held == 0


def test_one_body_within_its_limit_must_fit_the_budget() -> None:
    with pytest.raises(pydantic.ValidationError, match="max_held_body_bytes"):
        LimitSettings(max_body_bytes=1024, max_held_body_bytes=1023)
    assert LimitSettings().max_held_body_bytes >= LimitSettings().max_body_bytes


def test_more_than_the_whole_budget_is_too_large_not_a_wait() -> None:
    budget = BodyBudget()
    held = budget.hold(100)
    with pytest.raises(GatewayError) as refused:
        held.cover(101)  # no retry could take it: 413, not 429
    assert refused.value.code is ErrorCode.request_too_large and refused.value.status == 413
    assert budget.held == 0


def test_the_default_budget_counts_parsed_bodies() -> None:
    assert LimitSettings().max_held_body_bytes == 1024 * 1024 * 1024
