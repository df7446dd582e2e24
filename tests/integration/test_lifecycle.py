"""Graceful shutdown of a real `owngate serve` process: SIGTERM during open streams.

The gateway runs as its own process (signal handling only exists there) with the
provenance log on, in front of a simulator in this process whose streams take seconds.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.cli.main import main as owngate
from gateway.provenance import load_verifiers, verify_log, write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import ADMIN_TOKEN, TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.provenance import records

STREAMS = 50
TOKENS = 20  # at 10 tokens/s: a two-second stream
BODY = {
    "model": "m",
    "stream": True,
    "max_tokens": TOKENS,
    "messages": [{"role": "user", "content": "drain me"}],
}


def gateway_settings(sim: Sim, tmp_path: Path, drain_timeout_s: float) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "limits": {"drain_timeout_s": drain_timeout_s},
        "provenance": {"dir": "log", "origin": "test.owngate/drain", "signing_key_file": "log.key"},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
    }


@pytest.fixture
def draining(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[Callable[[float], tuple[GatewayProcess, str]]]:
    """Start a gateway with provenance (returns it and its verifier key)."""
    started: list[GatewayProcess] = []

    def make(drain_timeout_s: float) -> tuple[GatewayProcess, str]:
        sim = start_sim("vllm", models=("m",), decode_tokens_per_s=10.0, batch_slowdown=0.0)
        vkey = write_signing_key(tmp_path / "log.key", "test.owngate/drain")
        gateway = GatewayProcess(gateway_settings(sim, tmp_path, drain_timeout_s), tmp_path)
        started.append(gateway.start())
        return gateway, vkey

    yield make
    for gateway in started:
        gateway.stop(signal.SIGKILL)


class Stream:
    """One client stream, read event by event."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.events: list[bytes] = []

    @property
    def tokens(self) -> int:
        return sum(1 for e in self.events if b'"delta":{"content":' in e)

    @property
    def finished(self) -> bool:
        return any(b'"finish_reason":"length"' in e for e in self.events)

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == b"data: [DONE]"

    @property
    def error(self) -> dict[str, Any] | None:
        for event in self.events:
            if event.startswith(b"data: {") and b'"error"' in event:
                found: dict[str, Any] = orjson.loads(event[6:])["error"]
                return found
        return None

    async def run(self, client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/chat/completions", json=BODY) as response:
            assert response.status_code == 200
            buffer = b""
            async for data in response.aiter_bytes():  # a cut chunked body would raise
                buffer += data
                *complete, buffer = buffer.split(b"\n\n")
                self.events += [e for e in complete if not e.startswith(b":")]
                self.started.set()
            assert buffer == b""


async def sigterm_during_streams(gateway: GatewayProcess) -> tuple[list[Stream], list[str]]:
    """Open the streams, SIGTERM once all are under way, try new connections meanwhile."""
    assert gateway.proc is not None
    streams = [Stream() for _ in range(STREAMS)]
    limits = httpx.Limits(max_connections=STREAMS + 1)
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        base_url=gateway.url, headers=headers, limits=limits, timeout=60
    ) as client:
        tasks = [asyncio.create_task(s.run(client)) for s in streams]
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in streams)), 30)
        gateway.proc.send_signal(signal.SIGTERM)
        late = await late_arrivals(gateway.url, headers)
        await asyncio.gather(*tasks)
    return streams, late


async def late_arrivals(url: str, headers: dict[str, str]) -> list[str]:
    """New connections after SIGTERM, until one is refused: what each one got."""
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while loop.time() < deadline:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=5) as fresh:
            try:
                response = await fresh.post("/v1/chat/completions", json={**BODY, "stream": False})
            except httpx.ConnectError:
                seen.append("refused")
                return seen
            seen.append(str(response.status_code))
        await asyncio.sleep(0.02)
    return seen


def exit_code(gateway: GatewayProcess, timeout: float = 30) -> int:
    assert gateway.proc is not None
    code = gateway.wait(timeout_s=timeout)
    assert code == 0, gateway.output()
    return code


def assert_log_complete(tmp_path: Path, vkey: str) -> None:
    """The final checkpoint covers every record, every dispatch completed, and the
    auditor's command agrees."""
    summary = verify_log(tmp_path / "log", load_verifiers([vkey]))
    assert summary.size >= 2 * STREAMS
    assert summary.unsigned_entries == 0
    assert summary.open_dispatches == 0
    assert owngate(["audit", "verify", str(tmp_path / "log"), "--key", vkey]) == 0


def test_sigterm_lets_50_streams_finish(
    draining: Callable[[float], tuple[GatewayProcess, str]], tmp_path: Path
) -> None:
    gateway, vkey = draining(30.0)
    streams, late = asyncio.run(sigterm_during_streams(gateway))
    for stream in streams:
        assert stream.error is None
        assert stream.tokens == TOKENS  # the whole answer
        assert stream.finished
        assert stream.done
    assert late[-1] == "refused"
    assert set(late) <= {"200", "503", "refused"}  # 200 only before the drain began
    assert exit_code(gateway) == 0
    assert_log_complete(tmp_path, vkey)


def test_drain_deadline_cuts_streams_with_an_error_event(
    draining: Callable[[float], tuple[GatewayProcess, str]], tmp_path: Path
) -> None:
    gateway, vkey = draining(0.5)  # the streams need two seconds
    streams, _ = asyncio.run(sigterm_during_streams(gateway))
    for stream in streams:
        error = stream.error
        assert error is not None and error["code"] == "not_ready"
        assert 0 < stream.tokens < TOKENS
        assert not stream.finished
        assert not stream.done
    assert exit_code(gateway) == 0
    assert_log_complete(tmp_path, vkey)
    completions = [r for r in records(tmp_path / "log") if r["type"] == "completion"]
    assert len(completions) == STREAMS
    assert all(r["status"] == 503 and "shut down" in str(r["error"]) for r in completions)


def test_idle_keepalive_connections_do_not_hold_the_drain(
    draining: Callable[[float], tuple[GatewayProcess, str]],
) -> None:
    gateway, _ = draining(60.0)
    with httpx.Client(base_url=gateway.url) as idle:
        assert idle.get("/healthz").status_code == 200  # the connection stays open, idle
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)
        assert exit_code(gateway, timeout=20) == 0  # well before the 60 s drain deadline


def test_a_draining_app_is_not_ready_and_refuses_requests(
    start_sim: Callable[..., Sim],
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    app = create_app(gateway_config([backend("gpu", sim.url, "m")]), environ={})

    async def call(
        path: str, method: str = "GET", key: str = TENANT_KEY
    ) -> tuple[int, dict[str, Any]]:
        scope: dict[str, Any] = {"type": "http", "method": method, "path": path}
        scope["headers"] = [(b"authorization", f"Bearer {key}".encode())]
        sent: list[MutableMapping[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": orjson.dumps(BODY), "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent[0]["status"], orjson.loads(sent[1]["body"])

    async def scenario() -> None:
        app.ready = True
        app.begin_drain()
        status, ready = await call("/readyz")
        assert (status, ready) == (503, {"status": "not ready"})
        status, report = await call("/admin/status", key=ADMIN_TOKEN)
        assert (status, report["readiness"]["draining"]) == (200, True)
        status, answer = await call("/v1/chat/completions", "POST")
        assert (status, answer["error"]["code"]) == (503, "not_ready")

    asyncio.run(scenario())  # ends the drain's deadline task with the loop
