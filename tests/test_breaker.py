"""The circuit breaker's state machine, driven by an injected clock (no sockets)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config.schema import BreakerSettings
from gateway.routing.breaker import Breaker, Pass


def state(breaker: Breaker) -> str:
    """Read through a call: mypy would otherwise narrow `breaker.state` across calls."""
    return breaker.state.value


SETTINGS = BreakerSettings(failure_threshold=3, cooldown_s=1.0, max_cooldown_s=4.0)


def tripped(now: float = 0.0) -> Breaker:
    breaker = Breaker(SETTINGS)
    for _ in range(3):
        breaker.failed(now, "connect: refused")
    assert state(breaker) == "open"
    return breaker


def test_opens_after_consecutive_failures_only() -> None:
    breaker = Breaker(SETTINGS)
    breaker.failed(0.0, "HTTP 500")
    breaker.failed(0.0, "HTTP 500")
    breaker.succeeded()  # a success in between resets the count
    breaker.failed(0.0, "HTTP 500")
    breaker.failed(0.0, "HTTP 500")
    assert state(breaker) == "closed" and breaker.available(0.0)
    breaker.failed(0.0, "HTTP 500")
    assert state(breaker) == "open"
    assert not breaker.available(0.5) and breaker.begin(0.5) is None
    assert breaker.opens == 1 and breaker.last_error == "HTTP 500"


def test_half_open_lets_exactly_one_probe_through() -> None:
    breaker = tripped()
    assert breaker.available(1.0)  # the cooldown is over
    assert breaker.begin(1.0) is Pass.probe
    assert state(breaker) == "half_open"
    assert breaker.begin(1.0) is None and not breaker.available(1.0)
    breaker.succeeded()
    assert state(breaker) == "closed"
    assert breaker.begin(1.0) is Pass.normal


def test_failed_probe_reopens_with_a_doubled_cooldown_up_to_the_cap() -> None:
    breaker = tripped()
    now = 0.0
    cooldowns = []
    for _ in range(4):
        now = breaker.open_until
        assert breaker.begin(now) is Pass.probe
        breaker.failed(now, "timeout: no response")
        cooldowns.append(breaker.open_until - now)
    assert cooldowns == [2.0, 4.0, 4.0, 4.0]
    now = breaker.open_until
    assert breaker.begin(now) is Pass.probe
    breaker.succeeded()  # a request succeeded: the next opening starts from the base again
    for _ in range(3):
        breaker.failed(now, "HTTP 503")
    assert breaker.open_until - now == 1.0


def test_an_abandoned_probe_hands_the_probe_on() -> None:
    breaker = tripped()
    assert breaker.begin(1.0) is Pass.probe
    breaker.abandoned()  # the client left before the backend answered
    assert breaker.begin(1.0) is Pass.probe


def test_health_probes_open_and_close_without_growing_the_cooldown() -> None:
    breaker = Breaker(SETTINGS)
    breaker.probe_failed(0.0, "/health answered HTTP 503")
    assert state(breaker) == "open" and breaker.open_until == 1.0
    breaker.probe_ok(0.5)  # too early: the cooldown holds
    assert state(breaker) == "open"
    breaker.probe_failed(1.0, "/health answered HTTP 503")  # still loading
    assert breaker.open_until == 2.0  # base cooldown again, not doubled
    breaker.probe_ok(2.0)  # the scraper's probe is the half-open trial
    assert state(breaker) == "closed"


def test_outcomes_of_requests_begun_before_opening_do_not_close_it() -> None:
    breaker = tripped()
    breaker.succeeded()  # a long stream that started earlier finishes well
    assert state(breaker) == "open"


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match="max_cooldown_s must be at least cooldown_s"):
        BreakerSettings(cooldown_s=5.0, max_cooldown_s=1.0)
    with pytest.raises(ValidationError):
        BreakerSettings(failure_threshold=0)
