"""Routing under faults, over real sockets: backends that die, hang, load slowly or fail.

Simulators serve on loopback (in this process, or as an `owngate sim` process where the
test kills one); the gateway runs on a real uvicorn server in a thread. Every wait is on a
condition and bounded; the assertions are about where requests went and what the clients
received, never about speed. Nothing may depend on how fast a busy machine runs: the
backend holds requests until the test lets them go (`hang_rate`), breakers read a fake
clock the test moves, and scrape readings and probe marks outlast any stall.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.admin import is_loopback
from gateway.provenance import write_signing_key
from gateway.sim import Faults
from tests.helpers.clock import FakeClock
from tests.helpers.gateways import ADMIN_TOKEN, Gateway, Sim, admin_status, backend, readiness
from tests.helpers.net import free_port
from tests.helpers.processes import ServerProcess, owngate_argv
from tests.helpers.waiting import until, until_async

CHAT: dict[str, Any] = {
    "model": "m",
    "max_tokens": 3,
    "messages": [{"role": "user", "content": "hi"}],
}
# Probes and scrapes often, and marks and readings that outlast a stalled scraper on a
# loaded machine (a probe's "down" holds for staleness_s unless a later probe passes).
FAST_SCRAPE = {"interval_s": 0.05, "timeout_s": 2.0, "staleness_s": 30.0}


def chat(gateway: Gateway, timeout: float = 20.0, **changes: Any) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, **changes},
        headers=gateway.headers,
        timeout=timeout,
    )


def status_of(gateway: Gateway) -> dict[str, dict[str, Any]]:
    report = admin_status(gateway.url)
    return {b["id"]: b for b in report["backends"]}


@dataclasses.dataclass
class Outcome:
    status: int
    text: str
    done: bool  # ended with [DONE]
    error_event: bool  # a started stream that ended with an OpenAI error event


@pytest.fixture
def sim_process(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """`owngate sim` as its own process, so a test can SIGKILL it mid-load."""
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        port = free_port()
        argv = owngate_argv("sim", "--host", "127.0.0.1", "--port", str(port), *flags)
        service = ServerProcess(f"sim-{port}", argv, tmp_path, port)
        started.append(service)
        return service.wait_ready("/health", 30.0)

    yield start
    for service in started:
        service.kill()


def test_a_killed_backend_loses_no_request_before_the_first_byte(
    sim_process: Callable[..., ServerProcess],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
) -> None:
    doomed = sim_process("--kind", "vllm", "--model", "m", "--decode-tps", "200")
    survivor = start_sim("vllm", models=("m",), decode_tokens_per_s=200.0)
    gateway = start_gateway(
        [backend("doomed", doomed.url, "m"), backend("survivor", survivor.url, "m")],
        scrape=FAST_SCRAPE,
        # No half-open request probe within the test, however long it takes.
        routing={
            "default": {"strategy": "round_robin"},
            "breaker": {"cooldown_s": 60.0, "max_cooldown_s": 60.0},
        },
    )
    body = {**CHAT, "max_tokens": 20, "stream": True}
    outcomes: list[Outcome] = []
    killed_at: list[int] = []  # how many requests had finished at the kill

    async def client(http: httpx.AsyncClient, requests: int) -> None:
        for _ in range(requests):
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                text = (await response.aread()).decode()
            outcomes.append(
                Outcome(
                    response.status_code,
                    text,
                    "data: [DONE]" in text,
                    '"error"' in text and response.status_code == 200,
                )
            )
            if len(outcomes) == 30 and not killed_at:
                doomed.proc.kill()  # SIGKILL: connections reset, nothing said
                killed_at.append(len(outcomes))

    async def load() -> None:
        async with httpx.AsyncClient(
            base_url=gateway.url, headers=gateway.headers, timeout=30
        ) as http:
            await asyncio.gather(*(client(http, 25) for _ in range(6)))

    asyncio.run(load())
    assert killed_at and len(outcomes) == 150
    # Every request was answered 200. A stream that the backend broke off after its first
    # byte ends with an error event (never a retry); all others completed, failed over.
    assert all(o.status == 200 for o in outcomes), [o.status for o in outcomes]
    broken = [o for o in outcomes if not o.done]
    assert all(o.error_event and "data: {" in o.text for o in broken)
    assert len(broken) <= 6  # at most the streams in flight on it when it died
    # The traffic moved: the breaker and /health took it out after a few failed connects,
    # instead of every later request trying the dead backend first.
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    connect_failures = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("owngate_upstream_errors_total{")
        and 'backend="doomed"' in line
        and 'kind="connect"' in line
    )
    assert connect_failures <= 3 + 6
    assert survivor.app.stats.completed >= 150 - killed_at[0] - 6
    # /health marks it down too, after health.failures_to_down refused probes in a row.
    until(lambda: status_of(gateway)["doomed"]["health"] == "unhealthy", "marked down")
    doomed_status = status_of(gateway)["doomed"]
    assert not doomed_status["available"]
    assert doomed_status["health"] == "unhealthy"
    assert doomed_status["breaker"]["state"] == "open"


def test_a_hanging_backend_is_failed_over_at_its_first_byte_deadline(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    hung = start_sim("vllm", models=("m",), faults=Faults(hang_rate=1.0))
    healthy = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway(
        [
            backend("hung", hung.url, "m", first_byte_timeout_s=0.3),
            backend("healthy", healthy.url, "m"),
        ],
        routing={"default": {"strategy": "round_robin"}},
    )
    for stream in (False, True, False, True):
        # Within the client's 20 s: the hung backend's 0.3 s, not the default 120 s.
        assert chat(gateway, stream=stream).status_code == 200
    assert healthy.app.stats.completed == 4
    assert hung.app.stats.hangs >= 1  # it was tried, and hung, and the client never knew
    until(lambda: hung.app.stats.in_flight == 0, "the hung requests were dropped")


def test_the_failover_deadline_bounds_all_attempts_together(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    first = start_sim("vllm", models=("m",), faults=Faults(hang_rate=1.0))
    second = start_sim("vllm", models=("m",), faults=Faults(hang_rate=1.0))
    gateway = start_gateway(
        [
            backend("first", first.url, "m", first_byte_timeout_s=600.0),
            backend("second", second.url, "m", first_byte_timeout_s=600.0),
        ],
        routing={"failover": {"deadline_s": 0.5}},
    )
    # Answered within the client's 30 s: the 0.5 s deadline cut the backends' 600 s waits.
    response = chat(gateway, timeout=30.0)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


def test_a_loading_llamacpp_gets_nothing_until_healthy_then_its_slots_are_known(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    loading = start_sim(
        "llamacpp", models=("m",), zero_latency=True, slots=3, faults=Faults(slow_start_s=60.0)
    )
    ready = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway(
        [
            backend("cpu", loading.url, "m", kind="llamacpp"),
            backend("gpu", ready.url, "m", capacity={"max_concurrency": 64}),
        ],
        scrape=FAST_SCRAPE,
        routing={"default": {"strategy": "round_robin"}, "breaker": {"cooldown_s": 0.2}},
    )
    assert [chat(gateway).status_code for _ in range(6)] == [200] * 6
    assert loading.app.captured("/v1/chat/completions") == []
    cpu = status_of(gateway)["cpu"]
    assert cpu["health"] == "unhealthy" and "503" in cpu["health_error"]
    assert cpu["slots"] is None  # not learned while loading
    loading.app.start_loading(0.0)  # the model has loaded
    until(lambda: status_of(gateway)["cpu"]["available"], "the loaded backend is back")
    for _ in range(6):
        assert chat(gateway).status_code == 200
    assert len(loading.app.captured("/v1/chat/completions")) >= 2
    cpu = status_of(gateway)["cpu"]
    assert (cpu["slots"], cpu["slots_from"]) == (3, "learned")  # from /props total_slots
    assert status_of(gateway)["gpu"]["slots_from"] == "config"


def test_breaker_opens_then_a_half_open_probe_closes_it(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # Kind `openai`: no /health to probe, so only real requests judge this backend. The
    # breakers read a clock that moves only when the test moves it.
    flaky = start_sim("vllm", models=("m",), zero_latency=True, faults=Faults(error_rate=1.0))
    steady = start_sim("vllm", models=("m",), zero_latency=True)
    clock = FakeClock(1000.0)
    gateway = start_gateway(
        [backend("flaky", flaky.url, "m", kind="openai"), backend("steady", steady.url, "m")],
        clock=clock,
        routing={
            "default": {"strategy": "round_robin"},
            "breaker": {"failure_threshold": 3, "cooldown_s": 2.0, "max_cooldown_s": 8.0},
        },
    )
    for _ in range(12):
        assert chat(gateway).status_code == 200  # each 500 failed over to `steady`
    assert flaky.app.stats.errors == 3  # then the breaker kept requests away
    flaky_status = status_of(gateway)["flaky"]
    assert flaky_status["breaker"]["state"] == "open"
    assert flaky_status["breaker"]["last_error"] == "HTTP 500"
    assert flaky_status["health"] == "unprobed"
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    assert 'owngate_backend_breaker_state{backend="flaky",state="open"} 1.0' in metrics
    assert 'owngate_backend_breaker_opens_total{backend="flaky"} 1.0' in metrics
    assert readiness(gateway.url)["backends"]["flaky"]["breaker"] == "open"

    assert flaky_status["breaker"]["retry_in_s"] == 2.0

    # Still failing when the cooldown ends: the one probe fails and the breaker reopens
    # for twice as long.
    clock.now += 2.0
    assert status_of(gateway)["flaky"]["available"]
    for _ in range(4):
        assert chat(gateway).status_code == 200
    assert flaky.app.stats.errors == 4  # exactly one probe went through
    reopened = status_of(gateway)["flaky"]["breaker"]
    assert reopened["state"] == "open" and reopened["opens"] == 2
    assert reopened["retry_in_s"] == 4.0

    flaky.app.control.faults = Faults()  # repaired
    clock.now += 4.0
    before = flaky.app.stats.completed
    for _ in range(4):
        assert chat(gateway).status_code == 200
    assert status_of(gateway)["flaky"]["breaker"]["state"] == "closed"
    assert flaky.app.stats.completed - before >= 1  # traffic is back


def test_saturated_pool_queues_then_refuses_with_retry_after(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # One slot and two requests the backend holds until their client leaves: 2 in flight
    # over 1 slot is 1 waiting per slot > threshold 0.5, so the pool stays saturated for
    # exactly as long as the test holds them, however slowly the machine runs. (Timed
    # requests made this depend on the test's steps taking less than their decode time.)
    sim = start_sim("vllm", models=("m", "n"), slots=1, zero_latency=True)
    gateway = start_gateway(
        [backend("gpu", sim.url, "m", "n", capacity={"max_concurrency": 1})],
        scrape=FAST_SCRAPE,
        routing={
            "pools": {
                "m": {"queue": {"threshold": 0.5, "size": 1, "max_wait_s": 30.0}},
                "n": {"queue": {"threshold": 0.5, "size": 1, "max_wait_s": 0.3}},
            }
        },
    )
    queues = gateway.app.proxy.router.queues
    Responses = list[asyncio.Task[httpx.Response]]

    def post(http: httpx.AsyncClient, model: str) -> asyncio.Task[httpx.Response]:
        body = {**CHAT, "model": model}
        return asyncio.create_task(http.post("/v1/chat/completions", json=body))

    async def saturated(
        model: str, during: Callable[[httpx.AsyncClient], Awaitable[Responses]]
    ) -> list[httpx.Response]:
        """Run `during` while two held requests saturate the pool, then let them go and
        return the responses of the requests it sent."""
        async with (
            httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers, timeout=60) as held,
            httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers, timeout=60) as http,
        ):
            hung = sim.app.stats.hangs
            sim.app.control.faults = Faults(hang_rate=1.0)
            holders = [post(held, model), post(held, model)]
            await until_async(lambda: sim.app.stats.hangs == hung + 2, "both held by the backend")
            sim.app.control.faults = Faults()  # requests from now on are answered
            try:
                sent = await during(http)
            finally:
                for task in holders:  # their client leaves: the gateway drops them
                    task.cancel()
                await asyncio.gather(*holders, return_exceptions=True)
            return [await task for task in sent]

    async def queue_then_refuse(http: httpx.AsyncClient) -> Responses:
        queued = post(http, "m")
        await until_async(lambda: queues["m"].waiting == 1, "the third request waits")
        refused = post(http, "m")  # the queue (size 1) is full
        await asyncio.wait([refused])
        return [queued, refused]

    queued, refused = asyncio.run(saturated("m", queue_then_refuse))
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["retry-after"] == "1"
    assert queued.status_code == 200  # once the held requests ended, it went on
    assert sim.app.stats.completed == 1

    async def wait_it_out(http: httpx.AsyncClient) -> Responses:
        waiter = post(http, "n")  # waits max_wait_s, the pool saturated throughout
        await asyncio.wait([waiter])
        return [waiter]

    (timed_out,) = asyncio.run(saturated("n", wait_it_out))
    assert timed_out.status_code == 503
    assert timed_out.json()["error"]["code"] == "backend_unavailable"
    assert timed_out.headers["retry-after"] == "1"
    assert sim.app.stats.hangs == 4 and sim.app.stats.completed == 1


def test_a_burst_cannot_slip_past_the_saturation_check_while_its_dispatch_is_logged(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    # With the provenance log on, each request waits for its durable dispatch record
    # before it is sent. A request used to count as in flight on its backend only after
    # that wait, so every request of a burst saw an idle backend and went through: the
    # pool's queue (size 1) and its bound never applied. One slot, threshold 0.5: two
    # held requests saturate it; of a burst of four, two reach the backend, one waits in
    # the queue (503 past max_wait_s) and one finds the queue full (429).
    write_signing_key(tmp_path / "log.key", "test.owngate/log/burst")
    sim = start_sim("vllm", models=("m",), slots=1, zero_latency=True)
    sim.app.control.faults = Faults(hang_rate=1.0)  # every request held until it leaves
    gateway = start_gateway(
        [backend("gpu", sim.url, "m", capacity={"max_concurrency": 1})],
        scrape=FAST_SCRAPE,
        routing={"pools": {"m": {"queue": {"threshold": 0.5, "size": 1, "max_wait_s": 0.3}}}},
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": "test.owngate/log/burst",
            "signing_key_file": str(tmp_path / "log.key"),
        },
    )

    async def burst() -> tuple[list[int], int]:
        async with httpx.AsyncClient(
            base_url=gateway.url, headers=gateway.headers, timeout=60
        ) as http:
            sent = [
                asyncio.create_task(http.post("/v1/chat/completions", json=CHAT)) for _ in range(4)
            ]
            await until_async(  # the two refused answer within max_wait_s
                lambda: sum(task.done() for task in sent) >= 2,
                "two answered",
                timeout=30.0,
                interval=0.1,
            )
            hangs = sim.app.stats.hangs
            for task in sent:
                task.cancel()  # the held ones: their client leaves
            results = await asyncio.gather(*sent, return_exceptions=True)
        answered = [r.status_code for r in results if isinstance(r, httpx.Response)]
        return sorted(answered), hangs

    answered, reached = asyncio.run(burst())
    assert reached == 2, f"{reached} of 4 reached a one-slot backend past its queue"
    assert answered == [429, 503]


def owngate_status(*args: str, token: str = ADMIN_TOKEN) -> subprocess.CompletedProcess[str]:
    """The real command, in its own process (this one's stdout carries server logs), with
    the admin token in its environment variable."""
    argv = owngate_argv("status", *args)
    env = {**os.environ, "OWNGATE_ADMIN_TOKEN": token}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_owngate_status_prints_the_table_and_json(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway(
        [
            backend("gpu", sim.url, "m", capacity={"max_concurrency": 8}),
            backend("gone", "http://127.0.0.1:9", "m", kind="vllm"),
        ],
        scrape=FAST_SCRAPE,
    )
    until(lambda: status_of(gateway)["gpu"]["running"] is not None, "a first scrape")
    done = owngate_status("--url", gateway.url)
    assert done.returncode == 0, done.stderr
    table = done.stdout
    header, *rows = table.splitlines()
    assert header.split()[:4] == ["BACKEND", "KIND", "HEALTH", "BREAKER"]
    gpu = next(row for row in rows if row.startswith("gpu "))
    assert gpu.split()[:7] == ["gpu", "vllm", "healthy", "closed", "0/0", "0", "8"]
    assert any(row.startswith("gone ") and "unhealthy" in row for row in rows)
    assert "problems:" in table and "gone: /health: connect" in table

    done = owngate_status("--url", gateway.url, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    by_id = {b["id"]: b for b in report["backends"]}
    assert by_id["gpu"]["slots"] == 8 and by_id["gpu"]["scores"]["m"] > 0
    assert by_id["gpu"]["prefilling_tokens"] == 0  # nothing sent that awaits a first byte
    assert by_id["gone"]["available"] is False

    done = owngate_status("--url", "http://127.0.0.1:9", "--timeout", "2")
    assert done.returncode == 1 and "cannot read" in done.stderr

    done = owngate_status("--url", gateway.url, token="")
    assert done.returncode == 1 and "answered HTTP 401" in done.stderr
    done = owngate_status("--url", gateway.url, "--token", ADMIN_TOKEN, token="")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("client", "allowed"),
    [
        (("127.0.0.1", 5000), True),
        (("127.8.9.10", 5000), True),
        (("::1", 5000, 0, 0), True),
        (("10.0.0.7", 5000), False),
        (("::ffff:10.0.0.7", 5000, 0, 0), False),
        (None, False),
        (("unix-socket", 0), False),
    ],
)
def test_is_loopback_knows_the_loopback_addresses(
    client: tuple[Any, ...] | None, allowed: bool
) -> None:
    assert is_loopback({"type": "http", "client": client, "headers": []}) is allowed
