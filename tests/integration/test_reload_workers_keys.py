"""`serve --workers 2` (`state: memory`): a worker that could not read a changed keys
file (a key revoked) while its sibling read it. Before, it kept the older keys, stayed
ready and answered 200 to the revoked key while the sibling refused it 401, until its
retry (after 2, 4, ... 64 looks) read the file; now it is stale until a read of its
config files succeeds: 503 with `retry-after`, `/readyz` 503, re-read at every look."""

from __future__ import annotations

import json
import resource
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess, listening_sockets, worker_pids
from tests.helpers.waiting import until

BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
ROUND = 16  # requests on new connections: both workers take some, whatever the kernel


def _write_keys(path: Path, hashes: list[str]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(yaml.safe_dump({"tenants": {"acme": hashes}}))
    temporary.replace(path)  # atomic, as `owngate keys revoke` writes it


def _lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.split("\n")[:-1] if line.startswith("{")]


def _failures_after_sibling_reloaded(stderr: str, stale: int) -> int:
    """How many failed config reads worker `stale` logged after its sibling reloaded."""
    reloaded, failures = False, 0
    for line in _lines(stderr):
        if line.get("event") == "config reloaded" and line.get("worker") != stale:
            reloaded = True
        elif reloaded and line.get("worker") == stale and "reload failed" in line["event"]:
            failures += 1
    return failures


def _round(url: str, path: str = "/v1/chat/completions") -> list[httpx.Response]:
    headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        if path in ("/readyz", "/v1/models"):
            return [client.get(path) for _ in range(ROUND)]
        return [client.post(path, json=BODY) for _ in range(ROUND)]


def test_a_worker_that_could_not_read_a_revocation_refuses_until_it_does(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    keys = tmp_path / "keys.yaml"
    _write_keys(keys, [hash_api_key(KEY)])
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": False},
        "limits": {"drain_timeout_s": 5},
        "keys_file": "keys.yaml",
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "models": ["*"]}],
    }
    gateway = GatewayProcess(config, tmp_path, "--workers", "2").start()
    try:
        until(lambda: listening_sockets(gateway.port) == 2, "2 workers listening", timeout=60)
        assert {r.status_code for r in _round(gateway.url)} == {200}
        assert gateway.proc is not None
        stale = worker_pids(gateway.proc.pid)[0]
        index = int(
            next(
                v
                for v in Path(f"/proc/{stale}/environ").read_bytes().split(b"\0")
                if v.startswith(b"OWNGATE_WORKER_INDEX=")
            ).split(b"=")[1]
        )
        limits = resource.prlimit(stale, resource.RLIMIT_NOFILE)
        resource.prlimit(stale, resource.RLIMIT_NOFILE, (0, limits[1]))
        try:
            before = len(gateway.stderr())
            _write_keys(keys, [])  # acme's key revoked
            # Three failed reads: before, its next retry was 8 looks (8 s) away
            until(
                lambda: _failures_after_sibling_reloaded(gateway.stderr()[before:], index) >= 3,
                "the sibling reloading, then three failed reads of the worker",
                timeout=60,
                interval=0.05,
            )
        finally:
            resource.prlimit(stale, resource.RLIMIT_NOFILE, limits)
        answers = _round(gateway.url)
        ready = {r.status_code for r in _round(gateway.url, "/readyz")}
        listed = {r.status_code for r in _round(gateway.url, "/v1/models")}
        statuses = [a.status_code for a in answers]
        assert 200 not in statuses, statuses  # before: the revoked key served by the worker
        assert set(statuses) == {401, 503}, statuses
        for answer in answers:
            if answer.status_code == 503:
                assert answer.headers["retry-after"] == "1"
                assert "config" in answer.json()["error"]["message"], answer.text
        assert ready == {200, 503}, ready
        assert listed == {401, 503}, listed  # the tenant's read paths too (before: 200)
        # At its next look (1 s) it reads the file: the key refused by both, both ready
        until(
            lambda: {r.status_code for r in _round(gateway.url, "/readyz")} == {200},
            "the worker ready again",
            timeout=30,
            interval=0.5,
        )
        assert {r.status_code for r in _round(gateway.url)} == {401}
    finally:
        gateway.stop(signal.SIGTERM)
