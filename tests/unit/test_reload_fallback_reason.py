"""`fallback_refused`: whether a newer policy set's decision still lets a planned hosted
fallback run, for the reason the plan had (gateway/api/decided.py). Table-driven: the
decision the plan was made under, the newer one, the plan's reason and what each private
backend came to."""

from __future__ import annotations

import pytest

from gateway.api.decided import fallback_refused
from gateway.routing.attempt import FallbackBasis
from tests.helpers.gateways import decision

UNAVAILABLE = "when_private_unavailable"
SATURATED = "when_private_saturated"
BEFORE = decision(("a", "b"), ("h",), SATURATED, 1.0)

CASES: list[tuple[str, tuple[str, ...], str, float | None, str, FallbackBasis, bool]] = [
    # (name, now's private, now's mode, now's threshold, plan's reason, basis, refused)
    ("same mode, failed", ("a", "b"), SATURATED, 1.0, "private_unavailable",
     (("a", "failed"), ("b", "down")), False),
    ("busy still a reason", ("a", "b"), SATURATED, 1.0, "private_unavailable",
     (("a", "busy"), ("b", "failed")), False),
    ("busy no longer a reason", ("a", "b"), UNAVAILABLE, None, "private_unavailable",
     (("a", "busy"), ("b", "failed")), True),
    ("down and failed under unavailable", ("a", "b"), UNAVAILABLE, None,
     "private_unavailable", (("a", "down"), ("b", "failed")), False),
    ("a busy backend the reload excluded", ("b",), UNAVAILABLE, None, "private_unavailable",
     (("a", "busy"), ("b", "failed")), False),
    ("a private backend the plan never tried", ("a", "b", "c"), UNAVAILABLE, None,
     "private_unavailable", (("a", "failed"), ("b", "failed")), True),
    ("saturated, same mode and threshold", ("a", "b"), SATURATED, 1.0, "private_saturated",
     (("a", "saturated"), ("b", "saturated")), False),
    ("saturated, a lower threshold", ("a", "b"), SATURATED, 0.5, "private_saturated",
     (("a", "saturated"), ("b", "saturated")), False),
    ("saturated, a raised threshold", ("a", "b"), SATURATED, 2.0, "private_saturated",
     (("a", "saturated"), ("b", "saturated")), True),
    ("saturated is no reason under unavailable", ("a", "b"), UNAVAILABLE, None,
     "private_saturated", (("a", "saturated"), ("b", "saturated")), True),
    ("saturated, one down", ("a", "b"), SATURATED, 1.0, "private_saturated",
     (("a", "down"), ("b", "saturated")), False),
    ("saturated, a private backend never judged", ("a", "b", "c"), SATURATED, 1.0,
     "private_saturated", (("a", "saturated"), ("b", "saturated")), True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("private", "mode", "threshold", "reason", "basis", "refused"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_reload_keeps_a_fallback_only_for_a_reason_its_mode_accepts(
    private: tuple[str, ...],
    mode: str,
    threshold: float | None,
    reason: str,
    basis: FallbackBasis,
    refused: bool,
) -> None:
    now = decision(private, ("h",), mode, threshold)
    why = fallback_refused(BEFORE, now, reason, basis)
    assert (why is not None) is refused, why
    if why is not None:
        assert why.startswith(("fallback.mode", "saturation_threshold", mode, "c not judged"))
