"""Per-tenant fairness under `owngate serve --workers N`, as real processes.

A tenant's share of a private backend's connections (`limits.tenant_share_of_backend`,
gateway/upstream/tenant_share.py) is split over the workers, as tenant limits are with
`state: memory`: worker i of N enforces its part of the share, the parts summing to the
share, so one tenant holds no more of a backend through N workers than through one
process. A worker the supervisor starts again after it died starts its part of each
tenant limit spent (`state: memory`): the dead worker's ledger died with it, and a
client that can kill a worker must not get a fresh part each time. Requests go on new
connections, so the kernel spreads them over the workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.tenants import hash_api_key
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, Sim, backend
from tests.helpers.net import free_port
from tests.helpers.paced_stream import paced
from tests.helpers.processes import (
    GatewayProcess,
    listening_sockets,
    refused_start,
    worker_pids,
)
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.waiting import until

TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]
ASK = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
# New connections: each of 2 workers gets at least 2 of 16 but with odds above 99.9 %
OPENED = 16
SPREAD = 40  # new connections: one of 2 workers misses all of them with odds < 2**-38


def _config(backend_url: str, limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "limits": {"drain_timeout_s": 5, "connect_timeout_s": 1.0, **limits},
        "backends": [backend("gpu", backend_url, "m")],
        "tenants": TWO_TENANTS,
    }


@pytest.fixture
def start_workers(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def start(config: dict[str, Any], n: int) -> GatewayProcess:
        started.append(GatewayProcess(config, tmp_path, "--workers", str(n)).start())
        port = started[-1].port  # every worker listening: new connections reach each
        until(lambda: listening_sockets(port) == n, f"{n} workers listening", timeout=60)
        return started[-1]

    yield start
    for gateway in started:
        gateway.stop(signal.SIGTERM)


def _streams(raw: RawBackend) -> int:
    """Streams the backend took (each held there until the test releases them)."""
    return sum(1 for post in raw.posts if json.loads(post.body).get("stream"))


async def _open_streams(url: str, key: str, count: int) -> tuple[list[int], list[Any]]:
    """`count` long streams of `key`'s tenant, each on a connection of its own, read no
    further than their heads: their statuses and what to close."""
    clients = [httpx.AsyncClient(base_url=url, timeout=30) for _ in range(count)]
    body = {**ASK, "stream": True, "max_tokens": 3000}
    headers = {"authorization": f"Bearer {key}"}

    async def one(client: httpx.AsyncClient) -> httpx.Response:
        request = client.build_request("POST", "/v1/chat/completions", json=body, headers=headers)
        return await client.send(request, stream=True)

    responses = await asyncio.gather(*(one(client) for client in clients))
    return [r.status_code for r in responses], [*responses, *clients]


def test_a_tenants_share_of_a_backend_is_split_over_the_workers(
    start_raw: Callable[[Answer], RawBackend], start_workers: Callable[..., GatewayProcess]
) -> None:
    """A pool of 4 connections, two tenants: `acme` may hold 2 (the default share, 0.5).
    Through 2 workers it opens 16 streams on new connections and reads none: the backend
    takes 2 of them, one per worker's part (before: each worker gave it a whole share, 4
    streams, every connection a backend sized to the pool has), and `other` is served."""
    released = threading.Event()
    raw = start_raw(paced(released))
    gateway = start_workers(_config(raw.url, {"max_connections_per_backend": 4}), 2)

    async def run() -> tuple[list[int], int, int]:
        codes, held = await _open_streams(gateway.url, TENANT_KEY, OPENED)
        try:
            at_backend = _streams(raw)
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as other:
                theirs = await other.post(
                    "/v1/chat/completions",
                    json=ASK,
                    headers={"authorization": f"Bearer {OTHER_KEY}", "connection": "close"},
                )
            return codes, at_backend, theirs.status_code
        finally:
            released.set()
            for item in held:
                await item.aclose()

    codes, at_backend, theirs = asyncio.run(run())
    assert set(codes) <= {200, 503}, codes
    assert codes.count(200) == at_backend, (codes, at_backend)
    assert 1 <= at_backend <= 2, (codes, at_backend)  # acme's share of 4, through 2 workers
    assert theirs == 200


def test_a_share_smaller_than_the_workers_is_refused_at_start(tmp_path: Path) -> None:
    """A pool of 2 connections, two tenants: `acme`'s share is 1, which no split over 2
    workers holds (one would give it none), so `serve --workers 2` refuses to start,
    exit 1, naming the setting and the fix (before: each worker gave it 1, so it held
    the whole pool's worth of the backend)."""
    config = _config("http://127.0.0.1:9", {"max_connections_per_backend": 2})
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    text = refused_start(tmp_path, "--workers", "2")
    assert "tenant_share_of_backend" in text and "less than the 2 workers" in text, text


def _statuses(url: str, count: int) -> list[int]:
    """`count` chat requests of acme's, each on a new connection."""
    headers = {"authorization": f"Bearer {TENANT_KEY}", "connection": "close"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        return [client.post("/v1/chat/completions", json=ASK).status_code for _ in range(count)]


def test_a_restarted_worker_starts_its_part_of_a_limit_spent(
    start_sim: Callable[..., Sim], start_workers: Callable[..., GatewayProcess]
) -> None:
    """`requests_per_minute: 2` through 2 workers (`state: memory`): a part of 1 each,
    refilled a minute after it was used. Both parts used, a worker is killed (SIGKILL)
    and the supervisor starts it again: within the minute the restarted worker admits
    nothing (before: its fresh part, a third request in the minute, and one more for each
    death a client can cause)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = _config(sim.url, {})
    config["tenants"] = [
        {**TWO_TENANTS[0], "limits": {"requests_per_minute": 2}},
        TWO_TENANTS[1],
    ]
    gateway = start_workers(config, 2)
    began = time.monotonic()
    first = _statuses(gateway.url, SPREAD)
    assert first.count(200) == 2 and set(first) == {200, 429}, first  # one per worker

    assert gateway.proc is not None
    supervisor = gateway.proc.pid
    victim = worker_pids(supervisor)[0]
    os.kill(victim, signal.SIGKILL)
    until(
        lambda: len(worker_pids(supervisor)) == 2 and victim not in worker_pids(supervisor),
        "a replacement worker",
        timeout=30,
    )
    until(lambda: listening_sockets(gateway.port) == 2, "both workers listening", timeout=60)
    second = _statuses(gateway.url, SPREAD)
    minutes = int((time.monotonic() - began) // 60)  # each part refills once a minute
    assert set(second) <= {200, 429}, second
    assert second.count(200) <= 2 * minutes, (second, minutes)
