"""Per-tenant promises under `owngate serve --workers N`, as real processes.

With `state: memory` each worker holds its own ledger and enforces its part of each
tenant limit (the parts sum to the limit: together the workers never admit more); the
supervisor says so at start, naming the tenants with limits, and refuses to start a
limit smaller than the workers. With `state: redis` (a private redis-server) the
limits hold exactly across the workers, concurrency included, and no such warning comes.
A key revoked with `owngate keys revoke` is refused by every worker, with and without
Redis. Requests go on new connections, so the kernel spreads them over the workers.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import (
    KEY,
    GatewayProcess,
    listening_sockets,
    owngate_argv,
    refused_start,
)
from tests.helpers.redis_server import RedisServer
from tests.helpers.waiting import until

BODY = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
PER_WORKER = "tenant limits are split over the workers with state: memory"
SPREAD = 40  # new connections: each of 2 or 3 workers misses all of them with odds < 2**-23


def _config(sim_url: str, state: dict[str, Any], limits: dict[str, int]) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "limits": {"drain_timeout_s": 5},
        "state": state,
        "keys_file": "keys.yaml",
        "backends": [backend("gpu", sim_url, "m")],
        "tenants": [
            {"id": "acme", "models": ["*"], "limits": limits},
            {"id": "free", "models": ["*"]},
        ],
    }


@pytest.fixture
def start_workers(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def start(sim: Sim, state: dict[str, Any], limits: dict[str, int], n: int) -> GatewayProcess:
        keys = {"tenants": {"acme": [hash_api_key(KEY)]}}
        (tmp_path / "keys.yaml").write_text(yaml.safe_dump(keys))
        config = _config(sim.url, state, limits)
        started.append(GatewayProcess(config, tmp_path, "--workers", str(n)).start())
        # Every worker listening: the kernel spreads new connections over all of them
        port = started[-1].port
        until(lambda: listening_sockets(port) == n, f"{n} workers listening", timeout=60)
        return started[-1]

    yield start
    for gateway in started:
        gateway.stop(signal.SIGTERM)


def statuses(url: str, count: int, body: dict[str, Any] = BODY) -> list[int]:
    """`count` chat requests of acme's, each on a new connection."""
    headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        return [client.post("/v1/chat/completions", json=body).status_code for _ in range(count)]


def warnings(gateway: GatewayProcess) -> list[dict[str, Any]]:
    """The supervisor's and workers' JSON log lines at level warning."""
    lines = (gateway.stdout() + gateway.stderr()).splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return [event for event in events if event.get("level") == "warning"]


def revoke(gateway: GatewayProcess) -> None:
    done = subprocess.run(
        owngate_argv("keys", "revoke", KEY, "--config", "gateway.yaml"),
        cwd=gateway.directory,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def refilled(rpm: int, since: float) -> int:
    """Requests a GCRA bucket of `rpm` a minute gave back since `since` (monotonic)."""
    return int((time.monotonic() - since) * rpm / 60) + 1


def gauge(url: str, name: str) -> float:
    """Gauge `name` as one scrape of /metrics reports it."""
    text = httpx.get(f"{url}/metrics", headers={"connection": "close"}, timeout=5).text
    (line,) = [x for x in text.splitlines() if x.startswith(f"{name} ")]
    return float(line.split()[1])


def limit_copies(url: str) -> float:
    return gauge(url, "owngate_state_limit_copies")


def refused_everywhere(url: str) -> bool:
    return set(statuses(url, SPREAD)) == {401}


def test_memory_limits_are_split_over_the_workers_and_the_supervisor_says_so(
    start_sim: Callable[..., Sim], start_workers: Callable[..., GatewayProcess]
) -> None:
    """`requests_per_minute: 10` through 2 workers with `state: memory`: the workers
    admit 10 in all (parts of 5 and 5), over 60 new connections (before: each worker
    admitted a whole 10, up to 20)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_workers(sim, {"backend": "memory"}, {"requests_per_minute": 10}, 2)
    began = time.monotonic()
    answered = statuses(gateway.url, 60)
    assert set(answered) <= {200, 429}
    # Both parts' bursts (5 each), no more (plus what the buckets refilled meanwhile).
    assert 6 <= answered.count(200) <= 10 + refilled(10, began), answered

    said = [w for w in warnings(gateway) if w["event"].startswith(PER_WORKER)]
    assert len(said) == 1, gateway.output()  # the supervisor's, once
    assert said[0]["workers"] == 2
    assert said[0]["tenants_with_limits"] == ["acme"]  # `free` has none
    assert {gauge(gateway.url, "owngate_state_limit_parts") for _ in range(6)} == {2.0}
    assert limit_copies(gateway.url) == 1.0  # no worker holds a whole limit

    revoke(gateway)  # the keys file: every worker reloads it
    until(lambda: refused_everywhere(gateway.url), "every worker refusing the key", timeout=20)


def test_memory_token_budget_is_split_over_the_workers(
    start_sim: Callable[..., Sim], start_workers: Callable[..., GatewayProcess]
) -> None:
    """A 600-token budget through 2 workers with `state: memory`: requests reserving
    about 250 tokens each get one in per worker's part of 300, 2 (500 tokens) in all
    (before: two per worker, 4 and 1,000 tokens)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_workers(sim, {"backend": "memory"}, {"tokens_per_minute": 600}, 2)
    answered = statuses(gateway.url, SPREAD, {**BODY, "max_tokens": 250})
    assert set(answered) <= {200, 429}
    assert 1 <= answered.count(200) <= 2, answered  # 250 tokens refill in 25 s
    assert {gauge(gateway.url, "owngate_state_limit_parts") for _ in range(6)} == {2.0}


def test_memory_token_budget_takes_no_request_larger_than_a_workers_part(
    start_sim: Callable[..., Sim], start_workers: Callable[..., GatewayProcess]
) -> None:
    """A 600-token budget through 2 workers with `state: memory`, requests asking 400
    answer tokens (max_tokens): one process admits one (400 of 600), the second does not
    fit. Each worker's part is 300: a request that alone exceeds it can never fit there,
    and is refused at once (429 `tokens`, no retry-after), as one process refuses one over
    its whole budget. It used to be cut to the worker's part and admitted by each worker
    on a full part: 2 requests, 800 answer tokens, in a minute of a 600-token budget."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_workers(sim, {"backend": "memory"}, {"tokens_per_minute": 600}, 2)
    headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
    body = {**BODY, "max_tokens": 400}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as client:
        answers = [client.post("/v1/chat/completions", json=body) for _ in range(SPREAD)]
    assert [a.status_code for a in answers].count(200) <= 1, [a.status_code for a in answers]
    for answer in answers:
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["type"] == "tokens", answer.text
        assert "retry-after" not in answer.headers, answer.headers


def test_memory_concurrency_is_split_over_the_workers(
    start_sim: Callable[..., Sim], start_workers: Callable[..., GatewayProcess]
) -> None:
    """`concurrent_requests: 2` through 2 workers with `state: memory`: of 12 streams
    opened at once on new connections, at most 2 are admitted while they run, one per
    worker (before: 2 per worker, 4)."""
    sim = start_sim("vllm", models=("m",), decode_tokens_per_s=20.0)
    gateway = start_workers(sim, {"backend": "memory"}, {"concurrent_requests": 2}, 2)
    held = threading.Event()
    answered = threading.Semaphore(0)
    codes: list[int] = []

    def stream() -> None:
        body = {**BODY, "max_tokens": 400, "stream": True}
        headers = {"authorization": f"Bearer {KEY}"}
        code = 0  # no answer (the wait below fails on the count of codes)
        try:
            with (
                httpx.Client(timeout=60) as client,
                client.stream(
                    "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers
                ) as response,
            ):
                code = response.status_code
                codes.append(code)
                answered.release()
                for _ in response.iter_raw():
                    if held.is_set():
                        return
        finally:
            if not code:
                answered.release()

    threads = [threading.Thread(target=stream) for _ in range(12)]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert answered.acquire(timeout=30), "a stream got no answer"
        assert len(codes) == 12 and set(codes) <= {200, 429}, codes
        assert 1 <= codes.count(200) <= 2, codes
    finally:
        held.set()
        for thread in threads:
            thread.join(timeout=60)


def test_a_limit_smaller_than_the_workers_is_refused_at_start(tmp_path: Path) -> None:
    """`requests_per_minute: 1` and `--workers 2` with `state: memory`: no split holds
    it (one worker would get none of it), so `serve` refuses to start, exit 1, naming
    the tenant, the limit and the fix (before: it served, each worker admitting 1)."""
    config = _config("http://127.0.0.1:9", {"backend": "memory"}, {"requests_per_minute": 1})
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump({"tenants": {}}))
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    text = refused_start(tmp_path, "--workers", "2")
    assert "tenant acme: requests_per_minute 1 is less than the 2 workers" in text, text
    assert "state: redis" in text


def test_workers_started_with_redis_down_split_each_limit_over_the_workers(
    start_sim: Callable[..., Sim], start_workers: Callable[..., GatewayProcess]
) -> None:
    """`state: redis` on a port where no Redis answers, `--workers 2`: each worker has
    reached no Redis, so it knows of no other replica; it splits `requests_per_minute: 4`
    over the 2 workers anyway (before: each admitted 4, 8 in all)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    state = {"backend": "redis", "url": f"redis://127.0.0.1:{free_port()}/0"}
    gateway = start_workers(sim, state, {"requests_per_minute": 4}, 2)
    began = time.monotonic()
    answered = statuses(gateway.url, SPREAD)
    assert set(answered) <= {200, 429}
    assert 2 <= answered.count(200) <= 4 + 2 * refilled(2, began), answered


@pytest.mark.redis
def test_redis_limits_hold_across_workers_and_a_revocation_reaches_all(
    start_sim: Callable[..., Sim],
    start_workers: Callable[..., GatewayProcess],
    redis_server: RedisServer,
) -> None:
    sim = start_sim("vllm", models=("m",), decode_tokens_per_s=20.0)
    state = {"backend": "redis", "url": redis_server.url, "timeout_ms": 2000}
    limits = {"requests_per_minute": 8, "concurrent_requests": 2}
    gateway = start_workers(sim, state, limits, 3)
    assert not [w for w in warnings(gateway) if w["event"].startswith(PER_WORKER)]

    # Two streams (20 s of tokens each) hold acme's two slots, wherever they landed.
    held = threading.Event()
    opened = threading.Semaphore(0)
    codes: list[int] = []

    def hold() -> None:
        body = {**BODY, "max_tokens": 400, "stream": True}
        headers = {"authorization": f"Bearer {KEY}"}
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers
            ) as response,
        ):
            codes.append(response.status_code)
            opened.release()
            for _ in response.iter_raw():
                if held.is_set():
                    return

    threads = [threading.Thread(target=hold) for _ in range(2)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert opened.acquire(timeout=30), "a stream got no answer"
        assert codes == [200, 200]
        # No worker admits a third at once; 6 of the 8 a minute are left, none used.
        assert set(statuses(gateway.url, 12)) == {429}
    finally:
        held.set()
        for thread in threads:
            thread.join(timeout=60)

    # The slots freed: the minute's 8 requests (2 taken by the streams) over 3 workers.
    until(lambda: statuses(gateway.url, 1) == [200], "a slot freed", timeout=20)
    answered = statuses(gateway.url, SPREAD)
    # Exactly the rest of the one bucket, whichever worker answered (plus its refill).
    assert 8 - 2 - 1 <= answered.count(200) <= 8 - 2 - 1 + refilled(8, began), answered

    revoke(gateway)
    until(lambda: refused_everywhere(gateway.url), "every worker refusing the key", timeout=20)


@pytest.mark.redis
def test_redis_token_reservations_hold_across_workers(
    start_sim: Callable[..., Sim],
    start_workers: Callable[..., GatewayProcess],
    redis_server: RedisServer,
) -> None:
    """`tokens_per_minute: 1000` and requests asking `max_tokens: 400` (each reserves that
    and its prompt's estimate): two fit the minute's budget, whichever of 3 workers
    reserves them; a third does not fit until the budget refills (1000 tokens a minute)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    state = {"backend": "redis", "url": redis_server.url, "timeout_ms": 2000}
    gateway = start_workers(sim, state, {"tokens_per_minute": 1000}, 3)
    assert limit_copies(gateway.url) == 1.0  # shared across the workers
    began = time.monotonic()
    answered = statuses(gateway.url, 24, {**BODY, "max_tokens": 400})
    assert set(answered) <= {200, 429}
    refill = int((time.monotonic() - began) * 1000 / 60) // 400 + 1
    assert 2 <= answered.count(200) <= 2 + refill, answered
