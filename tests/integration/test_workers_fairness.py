"""Per-tenant fairness under `owngate serve --workers N`, as real processes.

A tenant's share of a private backend's connections (`limits.tenant_share_of_backend`,
gateway/upstream/tenant_share.py) is split over the workers, as tenant limits are with
`state: memory`: worker i of N enforces its part of the share, the parts summing to the
share, so one tenant holds no more of a backend through N workers than through one
process. Requests go on new connections, so the kernel spreads them over the workers.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.tenants import hash_api_key
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, backend
from tests.helpers.net import free_port
from tests.helpers.paced_stream import paced
from tests.helpers.processes import GatewayProcess, listening_sockets, owngate_argv
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.waiting import until

TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]
ASK = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
# New connections: each of 2 workers gets at least 2 of 16 but with odds above 99.9 %
OPENED = 16


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
    proc = subprocess.Popen(
        owngate_argv("serve", "--config", "gateway.yaml", "--workers", "2"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        pytest.fail("serve --workers 2 started with a share smaller than the workers")
    assert proc.returncode == 1, (out, err)
    text = err.decode()
    assert "tenant_share_of_backend" in text and "less than the 2 workers" in text, text
