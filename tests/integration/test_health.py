"""Active health: a live backend is never dropped by one slow `/health` probe.

Layers: the probe verdicts as a table (no I/O, no clock); `Registry.last_up`; the scraper
against real simulators whose `/health` answers late, rounds driven by hand under a fake
clock; and a gateway whose only backend's probes all time out while it serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from pydantic import ValidationError

from gateway.config.schema import HealthSettings, ScrapeSettings
from gateway.routing.breaker import BreakerState
from gateway.routing.health import ProbeHealth, Verdict
from gateway.routing.registry import Registry
from gateway.routing.scraper import MetricsScraper
from gateway.sim import Faults
from tests.helpers.clock import FakeClock
from tests.helpers.gateways import Gateway, Sim, backend, gateway_config
from tests.helpers.waiting import until

UP, SUSPECT, KEPT, DOWN = Verdict.up, Verdict.suspect, Verdict.kept, Verdict.down

# Steps: "pass" (/health answered 200), "timeout" (no answer in time), "refused"
# (connection refused or a status other than 200), each with "+last" when the backend is
# the last one up for a model; "traffic": it answered a proxied request (no verdict).
CASES: dict[str, list[tuple[str, Verdict | None]]] = {
    "one timeout does not mark a live backend down": [("pass", UP), ("timeout", SUSPECT)],
    "failures_to_down timeouts in a row do": [
        ("pass", UP),
        ("timeout", SUSPECT),
        ("timeout", SUSPECT),
        ("timeout", DOWN),
        ("timeout", DOWN),  # and keep it down
        ("pass", UP),
    ],
    "a passed probe in between starts the count again": [
        ("pass", UP),
        ("timeout", SUSPECT),
        ("timeout", SUSPECT),
        ("pass", UP),
        ("timeout", SUSPECT),
        ("timeout", SUSPECT),
        ("timeout", DOWN),
    ],
    "traffic answered since the last probe counts as a passed probe": [
        ("pass", UP),
        ("timeout", SUSPECT),
        ("timeout", SUSPECT),
        ("traffic", None),
        ("timeout", UP),
        ("timeout", SUSPECT),
        ("timeout", SUSPECT),
        ("timeout", DOWN),
    ],
    "a backend serving traffic stays up while every probe times out": [
        ("pass", UP),
        *[step for _ in range(6) for step in (("traffic", None), ("timeout", UP))],
    ],
    "traffic from streams still running brings a down backend back": [
        ("timeout", SUSPECT),
        ("timeout", SUSPECT),
        ("timeout", DOWN),
        ("traffic", None),
        ("timeout", UP),
    ],
    "the last backend up for a model is kept, never marked down": [
        ("pass", UP),
        ("timeout+last", SUSPECT),
        ("timeout+last", SUSPECT),
        ("timeout+last", KEPT),
        ("timeout+last", KEPT),
        ("refused+last", KEPT),  # seen alive: a refusal is probe evidence like any other
        ("timeout", DOWN),  # another backend is up again: now it may go
    ],
    "a live backend that refuses needs failures_to_down as well": [
        ("pass", UP),
        ("refused", SUSPECT),
        ("refused", SUSPECT),
        ("refused", DOWN),
    ],
    "not seen alive yet: a refusal (still loading) is down at once, even the last": [
        ("refused+last", DOWN),
        ("refused+last", DOWN),
        ("pass", UP),
    ],
    "not seen alive yet: a timeout is no refusal": [
        ("timeout", SUSPECT),
        ("timeout", SUSPECT),
        ("timeout+last", KEPT),
    ],
    "once marked down it is not seen alive: a refusal keeps even the last one out": [
        ("pass", UP),
        ("timeout", SUSPECT),
        ("timeout", SUSPECT),
        ("timeout", DOWN),
        ("refused+last", DOWN),
        ("timeout+last", KEPT),  # no answer at all is still no refusal
    ],
}


@pytest.mark.parametrize("steps", list(CASES.values()), ids=list(CASES))
def test_probe_verdicts(steps: list[tuple[str, Verdict | None]]) -> None:
    probe = ProbeHealth()
    answered = 0  # BackendState.answered, which the relay counts
    seen: list[Verdict | None] = []
    for step, _ in steps:
        event, _, last = step.partition("+")
        if event == "traffic":
            answered += 1
            seen.append(None)
        elif event == "pass":
            seen.append(probe.passed(answered))
        else:
            verdict = probe.failed(
                answered,
                refused=event == "refused",
                failures_to_down=3,
                last_up=last == "last",
            )
            seen.append(verdict)
    assert seen == [expected for _, expected in steps]


def test_one_failure_to_down_is_the_old_behaviour() -> None:
    probe = ProbeHealth()
    assert probe.passed(0) is UP
    assert probe.failed(0, refused=False, failures_to_down=1, last_up=False) is DOWN


def test_health_settings_are_validated() -> None:
    assert HealthSettings().failures_to_down == 3
    with pytest.raises(ValidationError):
        HealthSettings(failures_to_down=0)
    with pytest.raises(ValidationError):
        gateway_config([backend("a", "http://127.0.0.1:9", "m")], health={"failures": 3})


def test_last_up_is_per_model_and_counts_only_private_backends_up() -> None:
    hosted = {
        "id": "openai-hosted",
        "kind": "hosted",
        "provider": "openai",
        "models": [{"name": "m", "provider_model": "openai/gpt-4o"}],
        "region": "us",
        "owner": "openai",
        "api_key_env": "OPENAI_API_KEY",
    }
    config = gateway_config(
        [
            backend("a", "http://127.0.0.1:9", "m", "n"),
            backend("b", "http://127.0.0.1:9", "m"),
            backend("c", "http://127.0.0.1:9", "o", kind="openai"),
            hosted,
        ]
    )
    now = [100.0]
    registry = Registry.build(config, environ={}, clock=lambda: now[0])
    a, b, c = (registry.backends[i] for i in "abc")
    assert registry.last_up(a)  # the only backend for `n`
    assert not registry.last_up(b)  # `a` serves `m` too; the hosted one never counts
    assert registry.last_up(c)  # alone for `o`
    a.unhealthy_until = 110.0  # marked down by its probes
    assert registry.last_up(b)
    now[0] = 111.0  # the mark has aged out
    assert not registry.last_up(b)
    for _ in range(3):
        a.breaker.failed(now[0], "connect: refused")  # real requests failed: breaker open
    assert registry.last_up(b)


async def _rounds(scraper: MetricsScraper, count: int, clock: FakeClock) -> None:
    for _ in range(count):
        await scraper.scrape_once()
        clock.now += 0.5


def test_the_scraper_marks_down_after_failures_to_down_slow_probes(
    start_sim: Callable[..., Sim],
) -> None:
    busy = start_sim("vllm", models=("m",), faults=Faults(health_delay_s=3600.0))
    steady = start_sim("vllm", models=("m",))
    clock = FakeClock()
    # `steady` is never probed (kind openai): up whatever the machine's load, so `busy`
    # is never the last backend up.
    config = gateway_config(
        [backend("busy", busy.url, "m"), backend("steady", steady.url, "m", kind="openai")]
    )
    registry = Registry.build(config, environ={}, clock=clock)
    scraper = MetricsScraper(
        registry.backends.values(),
        ScrapeSettings(timeout_s=0.2),
        clock=clock,
        health=HealthSettings(failures_to_down=3),
        last_up=registry.last_up,
    )
    state = registry.backends["busy"]

    async def run() -> list[tuple[bool, str]]:
        seen = []
        try:
            for _ in range(4):
                await _rounds(scraper, 1, clock)
                seen.append((registry.is_down(state), state.breaker.state.value))
        finally:
            await scraper.close()
        return seen

    seen = asyncio.run(run())
    assert seen == [(False, "closed"), (False, "closed"), (True, "open"), (True, "open")]
    assert state.health_error in ("/health: timeout", "/health: no answer within scrape.timeout_s")
    assert not registry.is_down(registry.backends["steady"])


def test_the_scraper_never_takes_the_last_backend_up_out_on_probes_alone(
    start_sim: Callable[..., Sim],
) -> None:
    busy = start_sim("vllm", models=("m",), faults=Faults(health_delay_s=3600.0))
    clock = FakeClock()
    registry = Registry.build(
        gateway_config([backend("busy", busy.url, "m")]), environ={}, clock=clock
    )
    scraper = MetricsScraper(
        registry.backends.values(),
        ScrapeSettings(timeout_s=0.2),
        clock=clock,
        last_up=registry.last_up,
    )
    state = registry.backends["busy"]

    async def run() -> None:
        try:
            await _rounds(scraper, 5, clock)
        finally:
            await scraper.close()

    asyncio.run(run())
    assert len(busy.app.captured("/health")) == 5  # every probe was tried, and timed out
    assert state.probe.failures == 5
    assert not registry.is_down(state)
    assert state.breaker.state is BreakerState.closed and state.breaker.opens == 0


def test_requests_are_served_while_the_only_backends_health_probe_times_out(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # The case: one llama-server left, its HTTP threads busy, /health answering
    # later than the probe timeout. Before, one late probe opened its breaker and the
    # gateway answered 503 `no_compliant_backend` while the server was serving.
    sim = start_sim(
        "llamacpp", models=("m",), zero_latency=True, faults=Faults(health_delay_s=3600.0)
    )
    gateway = start_gateway(
        [backend("cpu", sim.url, "m", kind="llamacpp")],
        scrape={"interval_s": 0.05, "timeout_s": 0.1, "staleness_s": 1.0},
        health={"failures_to_down": 2},
    )
    # Probes run one after another: the fourth one arriving means three timed out, more
    # than failures_to_down, with no traffic in between.
    until(lambda: len(sim.app.captured("/health")) >= 4, "three probes timed out", timeout=20.0)
    cpu = gateway.app.registry.backends["cpu"]
    assert cpu.probe.failures >= 2

    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=gateway.url, headers=gateway.headers, timeout=20) as client:
        statuses = [client.post("/v1/chat/completions", json=body).status_code for _ in range(8)]
        assert statuses == [200] * 8
        before = cpu.answered
        with client.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}
        ) as response:
            assert response.status_code == 200
            response.read()
    assert cpu.answered >= before + 2  # the headers and each chunk read count as answers
    assert sim.app.stats.completed == 9
    assert not gateway.app.registry.is_down(cpu)
    assert cpu.breaker.opens == 0
