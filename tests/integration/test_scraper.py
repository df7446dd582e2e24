"""The gateway reads its backends' /metrics: fresh readings count, stale ones are unknown."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Callable

import httpx
import pytest
from pydantic import ValidationError

from gateway.config.schema import ScrapeSettings
from gateway.routing.breaker import BreakerState
from gateway.routing.registry import Registry
from gateway.routing.scraper import MAX_SCRAPE_BYTES, MetricsScraper, filter_exposition
from gateway.serving import ServerThread
from gateway.sim import Faults, SimSettings, create_sim_app
from gateway.upstream.http import DEFAULT_MAX_BODY
from tests.helpers.clock import FakeClock
from tests.helpers.gateways import ADMIN_HEADERS, Gateway, Sim, backend, gateway_config
from tests.helpers.waiting import until_async


def test_filter_exposition_keeps_only_wanted_samples() -> None:
    body = b'# HELP a x\n# TYPE a gauge\na 1\nab{x="1"} 2\nb{engine="0"} 3\nb 4 1700000000\n'
    assert (
        filter_exposition(body, frozenset({"a", "b"})) == 'a 1\nb{engine="0"} 3\nb 4 1700000000\n'
    )


def test_readings_go_stale_and_failures_are_reported() -> None:
    settings = SimSettings.for_kind("llamacpp", models=("m",))
    with ServerThread(create_sim_app(settings)) as sim:
        config = gateway_config(
            [
                backend("cpu", sim.url, "m", kind="llamacpp"),
                backend("gone", "http://127.0.0.1:9", "m", kind="vllm"),
                backend("other", sim.url, "m", kind="openai"),  # not a server we know how to read
            ]
        )
        clock = FakeClock()
        registry = Registry.build(config, environ={})
        scraper = MetricsScraper(
            registry.backends.values(), ScrapeSettings(interval_s=0.5, staleness_s=2.0), clock=clock
        )

        async def once() -> None:
            try:
                await scraper.scrape_once()
            finally:
                await scraper.close()

        asyncio.run(once())
        load = scraper.load("cpu")
        assert load is not None
        assert (load.running, load.waiting) == (0, 0)
        assert scraper.load("gone") is None
        assert (scraper.failure("gone") or "").startswith("connect")
        assert scraper.load("other") is None and scraper.failure("other") is None
        clock.now += 2.5  # older than staleness_s: unknown, never "idle"
        assert scraper.load("cpu") is None
        assert scraper.age("cpu") == 2.5


def test_gateway_publishes_backend_queue_from_scrapes(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # One slot and answers too long to end within the test: one request runs, two wait in
    # the backend's queue for as long as the test holds them (timed answers made this
    # depend on the polling keeping up with their decode). Readings outlast any stall.
    sim = start_sim("vllm", models=("m",), slots=1, decode_tokens_per_s=2.0)
    gateway = start_gateway(
        [backend("gpu", sim.url, "m")],
        scrape={"interval_s": 0.05, "timeout_s": 5.0, "staleness_s": 60.0},
    )
    body = {"model": "m", "max_tokens": 8000, "messages": [{"role": "user", "content": "hi"}]}

    def load_lines(text: str) -> tuple[str | None, ...]:
        prefixes = (
            'owngate_backend_running{backend="gpu"}',
            'owngate_backend_waiting{backend="gpu"}',
        )
        lines = text.splitlines()
        return tuple(next((ln for ln in lines if ln.startswith(p)), None) for p in prefixes)

    async def load_and_watch() -> tuple[str | None, dict[str, object]]:
        async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers) as client:
            requests = [
                asyncio.create_task(client.post("/v1/chat/completions", json=body, timeout=60))
                for _ in range(3)
            ]
            seen: list[tuple[str | None, ...]] = [()]

            async def one_running_two_waiting() -> bool:
                # Two requests can reach the backend's queue in the turn before its engine
                # admits either (running 0, waiting 2): wait for the settled reading.
                seen[0] = load_lines((await client.get("/metrics")).text)
                return seen[0] == (
                    'owngate_backend_running{backend="gpu"} 1.0',
                    'owngate_backend_waiting{backend="gpu"} 2.0',
                )

            try:
                await until_async(
                    one_running_two_waiting, "one request running, two waiting", timeout=20.0
                )
                line = seen[0][1]
                status = await client.get("/admin/status", headers=ADMIN_HEADERS)
                detail = status.json()["readiness"]["backends"]["gpu"]
            finally:
                for task in requests:
                    task.cancel()  # the client leaves: the backend drops them
                await asyncio.gather(*requests, return_exceptions=True)
            return line, detail

    seen, detail = asyncio.run(load_and_watch())
    assert seen == 'owngate_backend_waiting{backend="gpu"} 2.0'
    assert detail["running"] == 1 and detail["waiting"] == 2
    assert detail["metrics_error"] is None


def test_scrape_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match=r"longer than scrape\.interval_s"):
        ScrapeSettings(interval_s=2.0, staleness_s=1.0)


def test_health_probes_drive_the_breaker_and_llamacpp_slots_are_learned() -> None:
    settings = dataclasses.replace(
        SimSettings.for_kind("llamacpp", models=("m",)), slots=5, faults=Faults(slow_start_s=60)
    )
    app = create_sim_app(settings)
    with ServerThread(app) as sim:
        config = gateway_config(
            [
                backend("cpu", sim.url, "m", kind="llamacpp"),
                backend("sized", sim.url, "m", kind="llamacpp", capacity={"max_concurrency": 2}),
            ]
        )
        clock = FakeClock()
        registry = Registry.build(config, environ={}, clock=clock)
        scraper = MetricsScraper(registry.backends.values(), ScrapeSettings(), clock=clock)
        cpu = registry.backends["cpu"]

        async def rounds() -> None:
            try:
                await scraper.scrape_once()  # loading: /health and /props answer 503
                assert cpu.breaker.state is BreakerState.open
                assert cpu.learned_slots is None and registry.is_down(cpu)
                app.start_loading(0.0)
                clock.now += 0.5  # within the breaker's cooldown: a good probe is too early
                await scraper.scrape_once()
                assert cpu.breaker.state is BreakerState.open and cpu.health_error is None
                clock.now += 1.0
                await scraper.scrape_once()  # the half-open probe: closes it
            finally:
                await scraper.close()

        asyncio.run(rounds())
        assert cpu.breaker.state is BreakerState.closed and not registry.is_down(cpu)
        assert cpu.learned_slots == 5
        load = scraper.load("cpu")
        assert load is not None and load.slots_total == 5
        assert registry.backends["sized"].learned_slots is None  # configured: not asked


def test_a_scrape_is_read_up_to_its_limit_only() -> None:
    # A /metrics that never ends: reading stops at MAX_SCRAPE_BYTES, not at the 16 MiB an
    # answer may take, and the parser never sees it.
    written = [0]

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # a small send buffer: what it managed to write is close to what the scraper read
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET /health"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                piece = b"vllm:num_requests_running 1\n" * 2048
                for _ in range(1024):  # 56 MiB, if nobody stops it
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                    written[0] += len(piece)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the scraper hung up: what the test wants
        finally:
            writer.close()

    async def scrape() -> str | None:
        server = await asyncio.start_server(endless, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        registry = Registry.build(gateway_config([backend("gpu", url, "m")]), environ={})
        settings = ScrapeSettings(interval_s=1.0, timeout_s=60.0, staleness_s=120.0)
        scraper = MetricsScraper(registry.backends.values(), settings)
        try:
            await scraper.scrape_once()
        finally:
            await scraper.close()
            server.close()
        return scraper.failure("gpu")

    failure = asyncio.run(scrape())
    assert (failure or "").startswith("too_large"), failure
    # What was written is what the scraper read and what the kernel buffered for it: its
    # receive window grows with the fast first reads (to 7 MiB once on a loaded machine,
    # with tcp_rmem up to 32 MiB), so the bound is the 16 MiB a read to the answer's limit
    # would have taken, which was the bug.
    assert MAX_SCRAPE_BYTES < written[0] < DEFAULT_MAX_BODY


def test_a_backend_that_never_answers_does_not_age_the_others_readings() -> None:
    # Each backend is scraped on its own schedule: one that accepts and never answers
    # costs its own rounds scrape.timeout_s per read (/health, then /metrics), never the
    # others' (whose readings would otherwise go stale, i.e. unknown, every round).
    settings = ScrapeSettings(interval_s=0.05, timeout_s=2.0, staleness_s=1.5)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()  # until the scraper hangs up
        finally:
            writer.close()

    async def watch(sim_url: str) -> tuple[list[float], str | None]:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        config = gateway_config([backend("silent", url, "m"), backend("good", sim_url, "m")])
        registry = Registry.build(config, environ={})
        scraper = MetricsScraper(registry.backends.values(), settings)
        stale: list[float] = []  # the good backend's age whenever its reading was unknown

        def silent_timed_out() -> bool:
            age = scraper.age("good")
            if age is not None and scraper.load("good") is None:
                stale.append(age)
            return scraper.failure("silent") is not None

        running = asyncio.create_task(scraper.run())
        try:
            # The silent backend's /metrics timed out: 4 s into its first round.
            await until_async(silent_timed_out, "a timeout", timeout=30)
            return stale, scraper.failure("silent")
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            server.close()

    sim_settings = SimSettings.for_kind("vllm", models=("m",))
    with ServerThread(create_sim_app(sim_settings)) as sim:
        stale, failure = asyncio.run(watch(sim.url))
    assert (failure or "").startswith("timeout")
    assert stale == []
