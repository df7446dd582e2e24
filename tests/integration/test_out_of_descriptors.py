"""A gateway out of file descriptors says so, and does not blame its backends.

With the process at its open-file limit (lowered with `prlimit` on a real `owngate serve`
and reached with idle connections, which an unauthenticated client can open), a request
on a connection accepted before finds no descriptor for its backend connection. That used
to be the backend's `connect` failure: its circuit breaker opened after 3 such requests
(healthy backends taken out, requests refused or sent to a fallback for the cooldown), and
the client read "gpu: connect". Now it is `exhausted`, the gateway's own state: 503 in
OpenAI's format saying so (with `retry-after: 1`, as a busy backend's), counted as
`owngate_upstream_errors_total{kind="exhausted"}`, no breaker verdict
(`gateway/upstream/http.py`, `gateway/routing/attempt.py`); and a health probe that finds
no descriptor is no verdict on the backend (`gateway/routing/scraper.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.config.schema import HealthSettings, ScrapeSettings
from gateway.routing.breaker import BreakerState
from gateway.routing.registry import Registry
from gateway.routing.scraper import MetricsScraper
from gateway.upstream.hosted_errors import HostedError
from tests.helpers.attest import start_sidecar
from tests.helpers.clock import FakeClock
from tests.helpers.descriptor_rounds import burst, hosted_client, start_at_128, three_backends
from tests.helpers.gateways import ADMIN_HEADERS, Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.raw_backend import RawBackend, json_answer
from tests.helpers.raw_socket import WAIT_S, parse, read_answer
from tests.helpers.waiting import until

HEALTHZ = b"GET /healthz HTTP/1.1\r\nhost: g\r\n\r\n"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'
CHAT = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n"
    b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(BODY)
) + BODY
ANSWER = b'{"id": "c", "object": "chat.completion", "model": "m", "choices": []}'
SPARE = 8  # descriptors the gateway may open past those it holds when the limit is set


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _metric(url: str, line_start: str) -> str:
    lines = httpx.get(f"{url}/metrics", headers=ADMIN_HEADERS, timeout=WAIT_S).text.splitlines()
    return next((line for line in lines if line.startswith(line_start)), "")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_gateway_out_of_descriptors_does_not_charge_its_backend(
    process: Callable[..., GatewayProcess], start_sim: Callable[..., Sim], host: str
) -> None:
    """`localhost`: a backend named by a host name, whose lookup at the limit fails with
    EAI_SYSTEM and whatever errno the resolver left (EBUSY), not EMFILE: it was still the
    backend's `connect` failure, its breaker opened (`gateway/upstream/failures.py`
    `out_of_resources` now asks for a descriptor)."""
    port = start_sim("vllm", models=("m",), zero_latency=True).server.port
    gpu = {"id": "gpu", "kind": "vllm", "base_url": f"http://{host}:{port}"}
    backends = [gpu | {"models": [{"name": "m"}], "region": "eu", "owner": "t"}]
    scrape = {"interval_s": 30, "staleness_s": 60}
    gateway = process(scrape=scrape, backends=backends).start()
    assert gateway.proc is not None
    pid = gateway.proc.pid
    clients = [socket.create_connection(("127.0.0.1", gateway.port), WAIT_S) for _ in range(5)]
    flood: list[socket.socket] = []
    try:
        for sock in clients:  # each surely accepted before the limit
            sock.sendall(HEALTHZ)
            assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
        limit = _descriptors(pid) + SPARE
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
        for _ in range(2 * SPARE):  # idle, no byte sent: past the limit, dropped at accept
            flood.append(socket.create_connection(("127.0.0.1", gateway.port), WAIT_S))
        until(lambda: _descriptors(pid) >= limit, "the gateway at its open-file limit")
        refused = []
        for sock in clients[:4]:  # past the breaker's failure threshold (3)
            sock.sendall(CHAT)
            refused.append(parse(read_answer(sock)))
        for sock in flood:
            sock.close()
        until(lambda: _descriptors(pid) < limit - SPARE // 2, "descriptors given back")
        clients[4].sendall(CHAT)  # the backend was never charged: served at once
        status, _, body = parse(read_answer(clients[4]))
        assert status == 200, body
        opened = _metric(gateway.url, 'owngate_backend_breaker_opens_total{backend="gpu"}')
        assert opened.endswith(" 0.0"), opened
        exhausted = 'owngate_upstream_errors_total{backend="gpu",kind="exhausted"}'
        assert _metric(gateway.url, exhausted).endswith(" 4.0")
        said = [line for line in gateway.output().splitlines() if "out of file descriptors" in line]
        assert len(said) == 1 and '"requests":1' in said[0].replace(" ", ""), (
            said
        )  # a line a minute
        for status, headers, body in refused:
            assert status == 503, body
            assert headers.get("retry-after") == "1", headers  # as a busy backend's refusal
            error = httpx.Response(status, content=body).json()["error"]
            assert error["code"] == "backend_unavailable", error
            assert "out of file descriptors" in error["message"], error
        assert gateway.alive()
    finally:
        for sock in clients + flood:
            sock.close()


@contextlib.contextmanager
def _no_descriptor_left() -> Iterator[None]:
    """This process can open no descriptor until the block ends: its soft open-file limit
    is set to the lowest free descriptor number, then given back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_health_probes_that_find_no_descriptor_are_no_verdict(
    start_sim: Callable[..., Sim],
) -> None:
    """A probe the gateway could not even open a socket for says nothing of the backend.
    It was a refusal: a backend not yet seen alive was marked down at the first one, its
    breaker opened (another backend is up for its model, so it was not kept)."""
    probed = start_sim("vllm", models=("m",))
    steady = start_sim("vllm", models=("m",))
    clock = FakeClock()
    config = gateway_config(
        [backend("gpu", probed.url, "m"), backend("steady", steady.url, "m", kind="openai")]
    )
    registry = Registry.build(config, environ={}, clock=clock)
    scraper = MetricsScraper(
        registry.backends.values(),
        ScrapeSettings(timeout_s=WAIT_S),
        clock=clock,
        health=HealthSettings(failures_to_down=3),
        last_up=registry.last_up,
    )
    state = registry.backends["gpu"]

    async def run() -> tuple[bool, int, str | None]:
        try:
            with _no_descriptor_left():
                for _ in range(4):
                    await scraper.scrape_once()
                    clock.now += 0.5
            seen = (registry.is_down(state), state.probe.failures, scraper.failure("gpu"))
            await scraper.scrape_once()  # descriptors again: probed and read as ever
        finally:
            await scraper.close()
        return seen

    down, failures, reason = asyncio.run(run())
    assert (down, failures) == (False, 0)
    assert state.breaker.state is BreakerState.closed and state.breaker.opens == 0
    assert reason is not None and reason.startswith("exhausted: "), reason
    assert scraper.failure("gpu") is None and probed.app.captured("/health")


def test_idle_backend_connections_stay_within_the_listener_s_share(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """`owngate serve` under an open-file limit of 128 (its connection cap derived: 32),
    three backends: a client with a key sends 30 requests at once to each in turn. Each
    pool kept the 30 connections its requests gave back, idle (a keep-alive the backend
    holds open), so the third round needed 90 backend connections beside 30 clients and
    met the limit: its connections were reset. Now a connection opened at the cap closes
    the oldest idle one, of any backend (`gateway/upstream/sockets.py`)."""
    sims = {m: start_sim("vllm", models=(m,), decode_tokens_per_s=20) for m in "abc"}
    gateway = start_at_128(three_backends(sims), tmp_path)
    try:
        for model in "abc":
            burst(gateway, model)
    finally:
        gateway.stop(signal.SIGKILL)


def test_backend_connections_stay_within_the_share_across_reloads(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """The same rounds, with a reload before the second and the third that changes that
    round's backend (so it gets a new pool; the others keep theirs). Each reload's pools
    had a count of their own (`Registry.build` made one), so the three pools were counted
    apart again and the third round was reset as before; the count is now the process's,
    handed from a registry to the one a reload builds."""
    sims = {m: start_sim("vllm", models=(m,), decode_tokens_per_s=20) for m in "abc"}
    config = three_backends(sims)
    config["logging"]["level"] = "info"  # "config reloaded"
    gateway = start_at_128(config, tmp_path)
    assert gateway.proc is not None
    try:
        for reloads, model in enumerate("abc"):
            if reloads:
                changed = next(b for b in config["backends"] if b["id"] == model)
                changed["first_byte_timeout_s"] = 59.0  # a changed backend: a new pool
                gateway.path.write_text(yaml.safe_dump(config))
                gateway.proc.send_signal(signal.SIGHUP)
                said = "config reloaded"
                until(lambda: gateway.output().count(said) == reloads, "reloaded")  # noqa: B023
            burst(gateway, model)
    finally:
        gateway.stop(signal.SIGKILL)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_hosted_call_that_finds_no_descriptor_is_the_gateway_s_failure(host: str) -> None:
    """A hosted provider call the gateway could not open a socket for was the provider's
    `connect` failure ("could not connect to openai"), charged to the tenant's breaker
    and, from a second tenant, the provider's; now it is `exhausted`, read from the
    `OSError` in the cause chain: no breaker verdict, the prompt not charged
    (gateway/upstream/hosted_errors.py, gateway/api/hosted_relay.py). `localhost`: a
    provider named by a host name not looked up yet (a real provider's, once its lookup
    is no longer cached), whose lookup at the limit fails with EAI_SYSTEM and EBUSY."""
    closed_port = free_port()  # nothing listens: the first call is refused, as a provider down
    warm, client = hosted_client("127.0.0.1", closed_port), hosted_client(host, closed_port)
    request = {"model": "public", "messages": [{"role": "user", "content": "hi"}]}

    async def calls() -> tuple[HostedError, HostedError]:
        try:
            with pytest.raises(HostedError) as refused:  # LiteLLM loaded, its client made
                await warm.send("chat", request, "public")
            with _no_descriptor_left(), pytest.raises(HostedError) as exhausted:
                await client.send("chat", request, "public")
            return refused.value, exhausted.value
        finally:
            await warm.aclose()
            await client.aclose()

    refused, exhausted = asyncio.run(calls())
    assert refused.kind == "connect"
    assert exhausted.kind == "exhausted", exhausted
    assert "out of file descriptors" in exhausted.message


def test_a_sidecar_out_of_descriptors_answers_busy(tmp_path: Path) -> None:
    """`owngate attest` at its open-file limit: a request it cannot open a backend
    connection for gets 429 with `retry-after: 1`, as at its budgets (the gateway takes
    it for a busy backend: no breaker charged), not 503 "the backend did not answer:
    connect", which the gateway charged to the backend's breaker. The backend closes
    each connection after its answer, so the second request needs a new one."""
    backend = RawBackend(json_answer(ANSWER)).start()
    sidecar = start_sidecar(tmp_path, "attest-a", backend.url)
    pid = sidecar.process.proc.pid
    client = socket.create_connection(("127.0.0.1", sidecar.process.port), WAIT_S)
    flood: list[socket.socket] = []
    chat = CHAT.replace(b"authorization: Bearer " + KEY.encode() + b"\r\n", b"")
    try:
        client.sendall(chat)
        assert parse(read_answer(client))[0] == 200
        limit = _descriptors(pid) + SPARE
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
        for _ in range(2 * SPARE):
            flood.append(socket.create_connection(("127.0.0.1", sidecar.process.port), WAIT_S))
        until(lambda: _descriptors(pid) >= limit, "the sidecar at its open-file limit")
        client.sendall(chat)
        status, headers, body = parse(read_answer(client))
        assert status == 429, body
        assert headers["retry-after"] == "1"
        assert "out of file descriptors" in body.decode()
    finally:
        for sock in [client, *flood]:
            sock.close()
        sidecar.process.kill()
        backend.stop()
