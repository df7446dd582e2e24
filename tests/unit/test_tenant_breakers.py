"""Breakers that tell tenants apart: one tenant whose requests make a backend fail takes it
out for itself only; failures no tenant's input causes (connect, TLS), or failures of two
tenants, still take it out for everyone; with one tenant configured nothing changes. The
clock is injected and the attempts are the router's own (no sockets)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.cli.status import format_table
from gateway.config.schema import BreakerSettings, RoutingSettings
from gateway.routing.breaker import Breaker
from gateway.routing.registry import Registry
from gateway.routing.router import Outcome, Router
from gateway.routing.tenant_breakers import IDLE_S, MAX_TENANTS, TenantBreakers
from gateway.state import MemoryState
from tests.helpers.clock import FakeClock
from tests.helpers.gateways import backend, decision, gateway_config, hosted_backend

SETTINGS = BreakerSettings(failure_threshold=3, cooldown_s=1.0, max_cooldown_s=4.0)
TENANTS: list[dict[str, Any]] = [
    {"id": "acme", "models": ["*"]},
    {"id": "globex", "models": ["*"]},
]


def state(breaker: Breaker) -> str:
    return breaker.state.value


def setup(tenants: list[dict[str, Any]]) -> tuple[Router, Registry, FakeClock]:
    """`m` on private `gpu` with hosted `h` as its fallback, the given tenants."""
    clock = FakeClock()
    config = gateway_config(
        [
            backend("gpu", "http://127.0.0.1:9000", "m"),
            hosted_backend("h", "http://127.0.0.1:9100/v1", "m"),
        ],
        tenants=tenants,
    )
    registry = Registry.build(config, environ={"HOSTED_KEY": "k"}, clock=clock)
    router = Router(registry, RoutingSettings(), lambda _id: None, 1.0, MemoryState())
    return router, registry, clock


def tried(router: Router, tenant: str, failure: tuple[str, str] | None = None) -> list[str]:
    """One request of `tenant`, allowed `gpu` and then hosted `h`: the backends it tried
    (the plan yields only attempts their breakers admitted). `gpu`, when tried, fails with
    `failure` (an `UpstreamError` kind and detail; "http" for a 500 answer), or serves when
    None; `h` serves."""
    allowed = replace(decision(("gpu",), ("h",), "when_private_unavailable"), tenant=tenant)
    plan = asyncio.run(router.plan("m", allowed, {}, time.perf_counter()))
    backends = []
    for attempt in plan:
        backends.append(attempt.backend.id)
        if not attempt.private:
            plan.report(attempt, Outcome.served)
            break
        if failure is None:
            attempt.succeeded()
            plan.report(attempt, Outcome.served)
            break
        kind, detail = failure
        if kind == "http":
            attempt.failed(detail)
        else:
            attempt.upstream_failed(kind, detail)
        plan.report(attempt, Outcome.failed, detail)
    return backends


HTTP_500 = ("http", "HTTP 500")


def test_one_tenants_failures_take_the_backend_out_for_that_tenant_only() -> None:
    router, registry, _ = setup(TENANTS)
    gpu = registry.backends["gpu"]
    with capture_logs() as logs:
        for _ in range(3):  # acme's input makes the backend answer 500
            assert tried(router, "acme", HTTP_500) == ["gpu", "h"]
    assert state(gpu.breaker) == "closed"
    assert [(e["event"], e["backend"], e["tenant"], e["reason"]) for e in logs] == [
        ("backend circuit breaker opened for one tenant", "gpu", "acme", "HTTP 500")
    ]
    assert tried(router, "globex") == ["gpu"]  # not sent to the hosted fallback
    assert tried(router, "acme") == ["h"]  # acme's own requests skip it while it cools
    [(tenant, own)] = gpu.tenant_breakers.items()
    assert (tenant, state(own), own.last_error) == ("acme", "open", "HTTP 500")


@pytest.mark.parametrize("kind", ["timeout", "closed", "protocol"])
def test_failures_a_tenants_input_may_cause_are_scoped_to_it(kind: str) -> None:
    router, registry, _ = setup(TENANTS)
    for _ in range(4):
        tried(router, "acme", (kind, "no first byte in time"))
    assert state(registry.backends["gpu"].breaker) == "closed"
    assert tried(router, "globex") == ["gpu"]


@pytest.mark.parametrize("kind", ["connect", "tls"])
def test_connect_failures_still_take_it_out_for_everyone(kind: str) -> None:
    router, registry, _ = setup(TENANTS)
    for _ in range(3):
        tried(router, "acme", (kind, "connection refused"))
    assert state(registry.backends["gpu"].breaker) == "open"
    assert tried(router, "globex") == ["h"]
    assert registry.backends["gpu"].tenant_breakers.items() == []  # no tenant charged


@pytest.mark.parametrize("kind", ["busy", "retired"])
def test_failures_of_the_gateways_own_making_charge_no_breaker(kind: str) -> None:
    # busy: its own connection limit; retired: a pool closed with its config (a request
    # running past the drain timeout opened no connection on it)
    router, registry, _ = setup([TENANTS[0]])
    for _ in range(5):
        tried(router, "acme", (kind, "no connection opened"))
    assert state(registry.backends["gpu"].breaker) == "closed"
    assert tried(router, "acme") == ["gpu"]


def test_failures_of_two_tenants_take_it_out_for_everyone() -> None:
    router, registry, _ = setup([*TENANTS, {"id": "initech", "models": ["*"]}])
    tried(router, "acme", HTTP_500)
    tried(router, "acme", HTTP_500)
    tried(router, "globex", HTTP_500)
    assert state(registry.backends["gpu"].breaker) == "open"
    assert tried(router, "initech") == ["h"]


def test_another_tenants_success_ends_the_run() -> None:
    router, registry, _ = setup(TENANTS)
    for _ in range(5):
        tried(router, "acme", HTTP_500)  # its own breaker opens after three
        assert tried(router, "globex") == ["gpu"]
    tried(router, "globex", HTTP_500)  # one failure of its own after a success
    assert state(registry.backends["gpu"].breaker) == "closed"


def test_a_tenants_breaker_half_opens_and_its_success_forgets_it() -> None:
    router, registry, clock = setup(TENANTS)
    gpu = registry.backends["gpu"]
    for _ in range(3):
        tried(router, "acme", HTTP_500)
    clock.now += 1.0  # the cooldown is over: acme's next request is its probe
    assert tried(router, "acme") == ["gpu"]
    assert gpu.tenant_breakers.items() == []
    assert tried(router, "acme") == ["gpu"]


def test_with_one_tenant_its_failures_open_the_backends_breaker_as_before() -> None:
    router, registry, _ = setup([TENANTS[0]])
    assert not registry.per_tenant
    for _ in range(3):
        tried(router, "acme", HTTP_500)
    assert state(registry.backends["gpu"].breaker) == "open"
    assert tried(router, "acme") == ["h"]
    assert registry.backends["gpu"].tenant_breakers.items() == []


def test_the_backends_breaker_counts_a_run_but_one_tenant_alone_never_opens_it() -> None:
    breaker = Breaker(SETTINGS)
    for _ in range(10):
        breaker.failed(0.0, "HTTP 500", tenant="acme")
    assert state(breaker) == "closed" and breaker.failures == 10
    breaker.failed(0.0, "HTTP 500", tenant="globex")
    assert state(breaker) == "open"
    mixed = Breaker(SETTINGS)
    mixed.failed(0.0, "HTTP 500", tenant="acme")
    mixed.failed(0.0, "HTTP 500", tenant="acme")
    mixed.failed(0.0, "connect: refused")  # no tenant's doing
    assert state(mixed) == "open"


def test_the_tenant_map_is_bounded_and_idle_entries_expire() -> None:
    breakers = TenantBreakers()
    for i in range(MAX_TENANTS + 50):
        breakers.failed(f"t{i}", SETTINGS, float(i) / 1000, "HTTP 500", 0)
    assert len(breakers.items()) == MAX_TENANTS
    assert breakers.get("t0") is None and breakers.get(f"t{MAX_TENANTS + 49}") is not None
    breakers.failed("late", SETTINGS, IDLE_S + 10.0, "HTTP 500", 0)
    assert [tenant for tenant, _ in breakers.items()] == ["late"]


def test_owngate_status_names_a_tenant_the_backend_is_closed_to() -> None:
    scoped = {"tenant": "acme", "state": "open", "failures": 0, "retry_in_s": 2.0}
    breaker = {"state": "closed", "tenants": [{**scoped, "last_error": "HTTP 500"}]}
    table = format_table({"backends": [{"id": "gpu", "breaker": breaker}]})
    assert table.endswith("problems:\n  gpu: open for tenant acme only: HTTP 500")


def test_one_tenant_failing_each_probe_does_not_keep_the_backend_open_for_all() -> None:
    # The backend's breaker opened for a reason no tenant chose (it restarted); once the
    # cooldown is over, acme times a failing request to be its probe, cooldown after
    # cooldown. Reopened for everyone by each, globex would go to hosted `h` for good.
    router, registry, clock = setup(TENANTS)
    gpu = registry.backends["gpu"]
    for _ in range(3):
        tried(router, "globex", ("connect", "connection refused"))
    assert state(gpu.breaker) == "open"
    clock.now += 1.0
    assert tried(router, "acme", HTTP_500) == ["gpu", "h"]  # acme's probe fails
    assert tried(router, "globex") == ["gpu"]  # the probe was handed on: globex's closes it
    assert state(gpu.breaker) == "closed"


def test_two_tenants_failed_probes_or_one_no_tenant_caused_reopen_it() -> None:
    breaker = Breaker(SETTINGS)
    breaker.failed(0.0, "connect: refused", at_once=True)
    for tenant, reopened in (("acme", False), ("acme", False), ("globex", True)):
        assert breaker.begin(1.0 + breaker.cooldown()) is not None  # the probe
        breaker.failed(1.0, "HTTP 500", breaker.epoch, tenant=tenant)
        assert (state(breaker) == "open") is reopened
    assert breaker.begin(100.0) is not None
    breaker.failed(100.0, "connect: refused", breaker.epoch)
    assert state(breaker) == "open"
