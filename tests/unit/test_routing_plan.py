"""The router's plan, table-driven: which attempts a request gets, in which order and
under which fallback reason, for each fallback mode, with backends down, saturated, or
past the failover bounds; and what `report` puts back. No sockets: every attempt fails
(or serves) as the table says."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.config.schema import RoutingSettings
from gateway.routing.registry import Registry
from gateway.routing.router import Outcome, Plan, Router
from gateway.state import MemoryState
from tests.helpers.gateways import backend, decision, gateway_config, hosted_backend

PRIVATE = ("b0", "b1")
HOSTED = ("h0", "h1", "h2", "h3")


def router(**routing: Any) -> tuple[Router, Registry]:
    """`m` on private b0, b1 (one slot each) and hosted h0..h3; round robin, so a fresh
    router's first order is the config order."""
    config = gateway_config(
        [
            *(
                backend(b, f"http://127.0.0.1:{9000 + i}", "m", capacity={"max_concurrency": 1})
                for i, b in enumerate(PRIVATE)
            ),
            *(hosted_backend(h, "http://127.0.0.1:9100/v1", "m") for h in HOSTED),
        ]
    )
    registry = Registry.build(config, environ={"HOSTED_KEY": "k"}, clock=lambda: 0.0)
    settings = RoutingSettings.model_validate({"default": {"strategy": "round_robin"}, **routing})
    return Router(registry, settings, lambda _id: None, 1.0, MemoryState()), registry


def plan(r: Router, fallback: str, age_s: float = 0.0, threshold: float | None = None) -> Plan:
    allowed = decision(PRIVATE, HOSTED if fallback != "never" else (), fallback, threshold)
    return asyncio.run(r.plan("m", allowed, {}, time.perf_counter() - age_s))


def fail_all(p: Plan, busy: tuple[str, ...] = ()) -> list[tuple[str, str | None]]:
    """Every attempt fails (those in `busy` with a 429, the others a 503): (backend,
    fallback reason) of each, in order."""
    tried = []
    for attempt in p:
        backend_id = attempt.backend.id
        tried.append((backend_id, p.fallback))
        status = 429 if backend_id in busy else 503
        p.report(attempt, Outcome.failed, f"{backend_id}: HTTP {status}", busy=status == 429)
    return tried


U, S = "private_unavailable", "private_saturated"


@pytest.mark.parametrize(
    ("fallback", "down", "saturated", "routing", "tried", "final"),
    [
        ("never", (), False, {}, [("b0", None), ("b1", None)], None),
        ("never", ("b0",), False, {}, [("b1", None)], None),
        ("never", (), False, {"failover": {"max_attempts": 1}}, [("b0", None)], None),
        (
            "when_private_unavailable",
            (),
            False,
            {},
            [("b0", None), ("b1", None), ("h0", U), ("h1", U), ("h2", U)],  # hosted: 3 at most
            U,
        ),
        ("when_private_unavailable", ("b0", "b1"), False, {}, [("h0", U), ("h1", U), ("h2", U)], U),
        (  # not saturated: private first, hosted when private failed
            "when_private_saturated",
            (),
            False,
            {},
            [("b0", None), ("b1", None), ("h0", U), ("h1", U), ("h2", U)],
            U,
        ),
        (  # saturated: hosted first; then private, and no second hosted pass
            "when_private_saturated",
            (),
            True,
            {},
            [("h0", S), ("h1", S), ("h2", S), ("b0", None), ("b1", None)],
            None,
        ),
    ],
)
def test_plan_order(
    fallback: str,
    down: tuple[str, ...],
    saturated: bool,
    routing: dict[str, Any],
    tried: list[tuple[str, str | None]],
    final: str | None,
) -> None:
    r, registry = router(**routing)
    backends = registry.backends
    for backend_id in down:
        backends[backend_id].unhealthy_until = 1.0
        backends[backend_id].health_error = "/health refused"
    if saturated:  # 3 in flight elsewhere on one slot: 2 waiting per slot
        registry.set_peer_inflight({b: 3 for b in PRIVATE})
    p = plan(r, fallback, threshold=1.0 if fallback == "when_private_saturated" else None)
    assert fail_all(p) == tried
    assert p.fallback == final
    downs = [f"{b}: /health refused" for b in down]
    assert p.reasons == downs + [f"{b}: HTTP 503" for b, _ in tried]
    assert [b.inflight for b in backends.values()] == [0] * 6  # every attempt let go


def test_no_attempt_once_the_failover_deadline_passed() -> None:
    """The private backends are up, only the time ran out: they were not shown
    unavailable, so the request does not go to a hosted provider either."""
    r, _ = router(failover={"deadline_s": 1.0})
    p = plan(r, "when_private_unavailable", age_s=2.0)
    assert fail_all(p) == []
    assert p.reasons == [
        "failover deadline passed",
        "hosted fallback withheld: b0 not tried, b1 not tried",
    ]
    assert (p.fallback, p.withheld) == (None, p.reasons[1])


H3 = [("h0", U), ("h1", U), ("h2", U)]


@pytest.mark.parametrize(
    ("fallback", "routing", "down", "busy", "tried", "withheld", "basis"),
    [
        (  # max_attempts ran out while b1 was up and untried: no hosted fallback
            "when_private_unavailable",
            {"failover": {"max_attempts": 1}},
            (),
            (),
            [("b0", None)],
            "b1 not tried",
            (),
        ),
        (  # b0 down, b1 failed: every eligible private backend was unavailable
            "when_private_unavailable",
            {"failover": {"max_attempts": 1}},
            ("b0",),
            (),
            [("b1", None), *H3],
            None,
            (("b0", "down"), ("b1", "failed")),
        ),
        (  # a 429 is a busy backend, not an unavailable one
            "when_private_unavailable",
            {},
            (),
            ("b0",),
            [("b0", None), ("b1", None)],
            "b0 busy",
            (),
        ),
        (  # ... which the saturated mode accepts
            "when_private_saturated",
            {},
            (),
            ("b0",),
            [("b0", None), ("b1", None), *H3],
            None,
            (("b0", "busy"), ("b1", "failed")),
        ),
    ],
)
def test_hosted_fallback_only_once_every_private_backend_was_unavailable(
    fallback: str,
    routing: dict[str, Any],
    down: tuple[str, ...],
    busy: tuple[str, ...],
    tried: list[tuple[str, str | None]],
    withheld: str | None,
    basis: tuple[tuple[str, str], ...],
) -> None:
    r, registry = router(**routing)
    for backend_id in down:
        registry.backends[backend_id].unhealthy_until = 1.0
    threshold = 1.0 if fallback == "when_private_saturated" else None
    p = plan(r, fallback, threshold=threshold)
    assert fail_all(p, busy) == tried
    assert p.withheld == (None if withheld is None else f"hosted fallback withheld: {withheld}")
    assert p.basis == basis
    assert [b.inflight for b in registry.backends.values()] == [0] * 6


def test_an_attempt_counts_in_flight_until_reported() -> None:
    r, registry = router()
    backends = registry.backends
    p = plan(r, "never")
    attempt = next(iter(p))
    assert (attempt.backend.id, backends["b0"].inflight) == ("b0", 1)
    attempt.sending(4000)  # ~1000 prompt tokens queued at the backend
    assert backends["b0"].prefilling == 1000
    p.report(attempt, Outcome.served)
    assert (backends["b0"].inflight, backends["b0"].prefilling) == (0, 0)
    assert p.reasons == []


def test_a_hosted_backend_whose_breaker_is_open_is_skipped_and_not_counted() -> None:
    """Hosted providers have breakers as private backends do: one open is skipped when the
    hosted pass comes (its reason noted), and the next three are tried."""
    r, registry = router()
    for backend_id in ("b0", "b1", "h0"):
        registry.backends[backend_id].breaker.probe_failed(0.0, "down")
    p = plan(r, "when_private_unavailable")
    assert fail_all(p) == [(h, "private_unavailable") for h in ("h1", "h2", "h3")]
    assert "h0: failed moments ago" in p.reasons


def test_a_private_backend_whose_breaker_opened_after_planning_is_skipped_and_not_counted() -> None:
    """b0 was up at planning; by its turn its breaker is open (another request's failures):
    it is skipped as a hosted one would be (no attempt, so no dispatch record; its reason
    noted), it does not spend the one attempt `max_attempts` allows, and it counts as
    down for the fallback."""
    r, registry = router(failover={"max_attempts": 1})
    p = plan(r, "when_private_unavailable")
    registry.backends["b0"].breaker.probe_failed(0.0, "down")  # open for its cooldown
    assert fail_all(p) == [("b1", None), *H3]
    assert p.reasons[:2] == ["b0: circuit breaker open", "b1: HTTP 503"]
    assert p.basis == (("b0", "down"), ("b1", "failed"))
    assert [b.inflight for b in registry.backends.values()] == [0] * 6


def test_once_no_hosted_backend_can_be_called_the_rest_are_skipped_and_private_still_tried() -> (
    None
):
    """LiteLLM failing to load fails every hosted backend alike: the caller marks the plan
    `hosted_down` and the hosted attempts left are skipped (not admitted, not in flight),
    their reason noted; private backends after them (hosted first: saturated) still go."""
    r, registry = router()
    registry.set_peer_inflight({b: 3 for b in PRIVATE})  # saturated: hosted first
    p = plan(r, "when_private_saturated", threshold=1.0)
    tried = []
    for attempt in p:
        tried.append(attempt.backend.id)
        p.report(attempt, Outcome.failed, f"{attempt.backend.id}: failed")
        if attempt.backend.id == "h0":
            p.hosted_down = True
    assert tried == ["h0", "b0", "b1"]
    assert p.reasons == [
        "h0: failed",
        "h1: hosted provider unavailable (not tried)",
        "h2: hosted provider unavailable (not tried)",
        "h3: hosted provider unavailable (not tried)",
        "b0: failed",
        "b1: failed",
    ]
    assert [b.inflight for b in registry.backends.values()] == [0] * 6


def test_an_attempt_reported_skipped_does_not_spend_max_attempts() -> None:
    """b0 is withdrawn by a reload when its turn comes (the proxy reports it `skipped`:
    no record, nothing sent): the one attempt `max_attempts` allows is still b1's."""
    r, registry = router(failover={"max_attempts": 1})
    p = plan(r, "never")
    tried = []
    for attempt in p:
        tried.append(attempt.backend.id)
        if attempt.backend.id == "b0":
            p.report(attempt, Outcome.skipped, "b0: no longer admitted by policy set 2")
        else:
            p.report(attempt, Outcome.failed, f"{attempt.backend.id}: HTTP 503")
    assert tried == ["b0", "b1"]
    assert p.reasons == ["b0: no longer admitted by policy set 2", "b1: HTTP 503"]
    assert [b.inflight for b in registry.backends.values()] == [0] * 6


def test_hosted_attempts_refused_before_sending_do_not_spend_the_three() -> None:
    """Every hosted provider's checks refuse the request before anything is sent (the
    proxy reports each `skipped`): all four are checked, not only three."""
    r, registry = router()
    for backend_id in PRIVATE:
        registry.backends[backend_id].unhealthy_until = 1.0
    p = plan(r, "when_private_unavailable")
    tried = []
    for attempt in p:
        tried.append(attempt.backend.id)
        p.report(attempt, Outcome.skipped, f"{attempt.backend.id}: not sent")
    assert tried == list(HOSTED)
    assert [b.inflight for b in registry.backends.values()] == [0] * 6
