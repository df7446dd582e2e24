"""`BodyBudget`: the request bodies one process holds at once, across requests."""

from __future__ import annotations

import pydantic
import pytest

from gateway.api.body import held_bound, scan_body
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


def test_one_tenant_holds_at_most_its_part_and_leaves_the_rest_to_others() -> None:
    budget = BodyBudget()
    a1, a2, b = (budget.hold(100, t, 50) for t in ("a", "a", "b"))
    a1.cover(30)
    with pytest.raises(GatewayError) as refused:
        a2.cover(21)  # 51 of tenant a's: past its part, while the budget has room
    assert refused.value.code is ErrorCode.rate_limit_exceeded
    assert "max_held_body_bytes_per_tenant" in refused.value.message
    assert budget.held == 30 and budget.by_tenant == {"a": 30}
    a2.cover(20)
    b.cover(50)  # the other tenant's part is whole
    assert budget.held == 100 and budget.by_tenant == {"a": 50, "b": 50}
    for held in (a1, a2, b):
        held.release()
    assert budget.held == 0 and budget.by_tenant == {}  # no entry kept per tenant


def test_more_than_a_tenant_s_part_is_too_large() -> None:
    held = BodyBudget().hold(100, "a", 50)
    with pytest.raises(GatewayError) as refused:
        held.cover(51)
    assert refused.value.status == 413
    assert "max_held_body_bytes_per_tenant" in refused.value.message


def test_a_tenant_s_part_is_half_the_budget_unless_set() -> None:
    assert LimitSettings().tenant_held_body_bytes == 512 * 1024 * 1024
    small = LimitSettings(max_body_bytes=1000, max_held_body_bytes=1500)
    assert small.tenant_held_body_bytes == 1000  # one body's bytes at least
    assert LimitSettings(max_held_body_bytes_per_tenant=2**30).tenant_held_body_bytes == 2**30
    with pytest.raises(pydantic.ValidationError, match="max_held_body_bytes_per_tenant"):
        LimitSettings(max_body_bytes=1024, max_held_body_bytes_per_tenant=1023)
    with pytest.raises(pydantic.ValidationError, match="max_held_body_bytes_per_tenant"):
        LimitSettings(max_held_body_bytes_per_tenant=2**30 + 1)


def test_a_tenant_s_part_must_hold_a_whole_body_s_reservation() -> None:
    """A body is reserved up to six times its size before its values (`held_bound`): a
    part set between one and six bodies would refuse the larger bodies with 413 for good."""
    body = ('"' + "\u00e9" * 1000 + '"').encode()  # not ASCII: up to 4 bytes a character
    assert held_bound(body, scan_body(body)) == 6 * len(body)
    with pytest.raises(pydantic.ValidationError, match=r"6 x limits\.max_body_bytes"):
        LimitSettings(max_body_bytes=len(body), max_held_body_bytes_per_tenant=len(body))
    with pytest.raises(pydantic.ValidationError, match="max_held_body_bytes_per_tenant"):
        LimitSettings(max_body_bytes=1024, max_held_body_bytes_per_tenant=6 * 1024 - 1)
    settings = LimitSettings(max_body_bytes=1024, max_held_body_bytes_per_tenant=6 * 1024)
    assert settings.tenant_held_body_bytes == 6 * 1024
