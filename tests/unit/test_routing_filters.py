"""The routing filters, table-driven: trust (the decision's eligible set) and health
(breaker and `/health` marks), with no sockets and an injected clock."""

from __future__ import annotations

import pytest

from gateway.config.schema import BreakerSettings
from gateway.routing.breaker import Breaker, BreakerState
from gateway.routing.filters.health import available_routes, unavailable, why_down
from gateway.routing.filters.trust import eligible_hosted, eligible_private
from gateway.routing.registry import Registry, Route
from tests.helpers.gateways import backend, decision, gateway_config, hosted_backend


def routes() -> tuple[Route, ...]:
    """`m` served by private b0, b1, b2 and hosted h0, h1, in that config order."""
    config = gateway_config(
        [
            *(backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", "m") for i in range(3)),
            *(hosted_backend(f"h{i}", "http://127.0.0.1:9100/v1", "m") for i in range(2)),
        ]
    )
    return Registry.build(config, environ={"HOSTED_KEY": "k"}).routes["m"]


@pytest.mark.parametrize(
    ("private", "hosted", "want_private", "want_hosted"),
    [
        (("b0", "b1", "b2"), (), ["b0", "b1", "b2"], []),  # everything private
        (("b2", "b0"), (), ["b0", "b2"], []),  # private keeps config order (picker orders)
        ((), ("h1", "h0"), [], ["h1", "h0"]),  # hosted keeps the decision's fallback order
        (("b1",), ("h0",), ["b1"], ["h0"]),
        (("b9",), ("h9", "b0"), [], ["b0"]),  # unknown ids: nothing; ids are taken as given
        ((), (), [], []),  # the decision admits nothing
    ],
)
def test_trust_filter_admits_only_the_decisions_backends(
    private: tuple[str, ...],
    hosted: tuple[str, ...],
    want_private: list[str],
    want_hosted: list[str],
) -> None:
    served_by = routes()
    by_id = {r.backend.id: r for r in served_by}
    allowed = decision(private, hosted)
    assert [r.backend.id for r in eligible_private(served_by, allowed)] == want_private
    assert [r.backend.id for r in eligible_hosted(by_id, allowed)] == want_hosted


SETTINGS = BreakerSettings(failure_threshold=1, cooldown_s=1.0, max_cooldown_s=1.0)


def breaker(state: str, open_until: float = 0.0, probing: bool = False) -> Breaker:
    return Breaker(SETTINGS, BreakerState(state), open_until=open_until, probing=probing)


@pytest.mark.parametrize(
    ("breaker_", "unhealthy_until", "now", "down"),
    [
        (breaker("closed"), 0.0, 5.0, False),  # healthy
        (breaker("closed"), 6.0, 5.0, True),  # marked down by its probes until 6
        (breaker("closed"), 5.0, 5.0, False),  # the mark ran out
        (breaker("open", open_until=6.0), 0.0, 5.0, True),  # cooling down
        (breaker("open", open_until=5.0), 0.0, 5.0, False),  # cooled down: a probe may go
        (breaker("half_open", probing=True), 0.0, 5.0, True),  # its one probe is out
        (breaker("half_open"), 0.0, 5.0, False),  # the probe came back without a verdict
    ],
)
def test_health_filter(breaker_: Breaker, unhealthy_until: float, now: float, down: bool) -> None:
    served_by = routes()[:2]
    target = served_by[0].backend
    target.breaker, target.unhealthy_until = breaker_, unhealthy_until
    assert unavailable(target, now) is down
    reasons: list[str] = []
    up = available_routes(served_by, now, reasons)
    assert [r.backend.id for r in up] == (["b1"] if down else ["b0", "b1"])
    assert reasons == (["b0: failed moments ago"] if down else [])


@pytest.mark.parametrize(
    ("health_error", "reason"),
    [
        (None, "b0: failed moments ago"),
        ("/health answered HTTP 503", "b0: /health answered HTTP 503"),
    ],
)
def test_health_filter_names_why(health_error: str | None, reason: str) -> None:
    target = routes()[0].backend
    target.health_error = health_error
    assert why_down(target) == reason
