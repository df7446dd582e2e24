"""A key revoked through Redis stays revoked on this host when Redis is down at a process's
start: each gateway writes the revocations it learns to its local list
(`state.revocations_file`) and reads it before its first request. Before, a gateway (or a
worker of `serve --workers N` its supervisor restarted after a kill -9) started while
Redis was down knew no revocation at all and served the revoked key: one listed in
gateway.yaml itself, or in a keys file the revocation did not clean (it was made on
another host, whose own copy `owngate keys revoke` cleaned). A list that cannot be read
stops the start (fail closed), naming the file and never quoting it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.cli.main import main
from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import (
    KEY,
    GatewayProcess,
    listening_sockets,
    refused_start,
    worker_pids,
)
from tests.helpers.redis_server import RedisServer
from tests.helpers.waiting import until

BODY = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
ROUND = 16  # requests on new connections: both workers take some, whatever the kernel


def _config(sim: Sim, redis: RedisServer, listed: str) -> dict[str, Any]:
    tenant: dict[str, Any] = {"id": "acme", "models": ["*"]}
    if listed == "inline":
        tenant["api_key_hashes"] = [hash_api_key(KEY)]
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": False},
        "limits": {"drain_timeout_s": 2},
        "keys_file": "keys.yaml",
        "state": {
            "backend": "redis",
            "url": redis.url,
            "key_prefix": "test",
            "timeout_ms": 200,
            "sync_interval_s": 0.05,
            "lease_ttl_s": 1,
        },
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [tenant],
    }


def _host(directory: Path, config: dict[str, Any], listed: str) -> Path:
    """A host's directory: its gateway.yaml and its own copy of the keys file."""
    directory.mkdir(parents=True, exist_ok=True)
    hashes = [hash_api_key(KEY)] if listed == "keys_file" else []
    (directory / "keys.yaml").write_text(yaml.safe_dump({"tenants": {"acme": hashes}}))
    (directory / "gateway.yaml").write_text(yaml.safe_dump(config))
    return directory


def _statuses(url: str) -> list[int]:
    headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        return [client.post("/v1/chat/completions", json=BODY).status_code for _ in range(ROUND)]


def _revoke_elsewhere(other: Path) -> None:
    """`owngate keys revoke` on another host: Redis takes it, that host's files change."""
    assert main(["keys", "revoke", KEY, "--config", str(other / "gateway.yaml")]) == 0


@pytest.mark.redis
@pytest.mark.parametrize("listed", ["inline", "keys_file"])
def test_a_gateway_restarted_while_redis_is_down_still_refuses_a_revoked_key(
    start_sim: Callable[..., Sim], redis_server: RedisServer, tmp_path: Path, listed: str
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = _config(sim, redis_server, listed)
    here = _host(tmp_path / "here", config, listed)
    other = _host(tmp_path / "other", config, listed)
    gateway = GatewayProcess(config, here).start()
    try:
        assert set(_statuses(gateway.url)) == {200}
        _revoke_elsewhere(other)
        until(lambda: set(_statuses(gateway.url)) == {401}, "the gateway refusing the key")
        assert gateway.stop(signal.SIGTERM) == 0  # its last look writes what it learned
        redis_server.stop()
        gateway.start()  # Redis down: it starts degraded, from what this host knows
        statuses = _statuses(gateway.url)
        assert set(statuses) == {401}, statuses  # before: 200, the revocation forgotten
        if listed == "keys_file":  # this host's keys file still lists the key
            assert "acme" in (here / "keys.yaml").read_text()
            assert hash_api_key(KEY) in (here / "keys.yaml").read_text()
    finally:
        gateway.stop(signal.SIGKILL)


@pytest.mark.redis
def test_workers_killed_while_redis_is_down_come_back_refusing_a_revoked_key(
    start_sim: Callable[..., Sim], redis_server: RedisServer, tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = _config(sim, redis_server, "inline")
    here = _host(tmp_path / "here", config, "inline")
    other = _host(tmp_path / "other", config, "inline")
    gateway = GatewayProcess(config, here, "--workers", "2").start()
    try:
        until(lambda: listening_sockets(gateway.port) == 2, "2 workers listening", timeout=60)
        assert set(_statuses(gateway.url)) == {200}
        _revoke_elsewhere(other)
        digest = hash_api_key(KEY)
        listed = here / "revoked-keys"
        until(
            lambda: listed.is_file() and digest in listed.read_text(),
            "a worker writing the revocation it learned from Redis to this host's list",
            timeout=30,
        )
        redis_server.stop()
        assert gateway.proc is not None
        killed = worker_pids(gateway.proc.pid)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        supervisor = gateway.proc.pid
        until(
            lambda: (
                len(set(worker_pids(supervisor)) - set(killed)) == 2
                and listening_sockets(gateway.port) == 2
            ),
            "both workers started again and listening",
            timeout=60,
            detail=gateway.output,
        )
        statuses = _statuses(gateway.url)
        assert set(statuses) == {401}, statuses  # before: 200 from both new workers
    finally:
        gateway.stop(signal.SIGTERM)


@pytest.mark.parametrize("damage", ["cut", "edited", "directory"])
def test_a_list_that_cannot_be_read_stops_the_start(
    start_sim: Callable[..., Sim], tmp_path: Path, damage: str
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "models": ["*"], "api_key_hashes": [hash_api_key(KEY)]}],
    }
    here = _host(tmp_path, config, "inline")
    assert main(["keys", "revoke", KEY, "--config", str(here / "gateway.yaml")]) == 1  # inline
    listed = here / "revoked-keys"
    written = listed.read_bytes()
    assert hash_api_key(KEY).encode() in written
    if damage == "cut":  # at a line boundary: the end line says how many it held
        listed.write_bytes(written[: written.index(b"\nend ") + 1])
    elif damage == "edited":  # the digest replaced by another well-formed one
        listed.write_bytes(written.replace(hash_api_key(KEY).encode(), b"sha256:" + b"0" * 64))
    else:
        listed.unlink()
        listed.mkdir()
    damaged = listed.read_bytes() if listed.is_file() else None
    assert main(["keys", "revoke", KEY, "--config", str(here / "gateway.yaml")]) == 1
    assert (listed.read_bytes() if listed.is_file() else None) == damaged  # not written over
    err = refused_start(here)  # before: started, and served the revoked key
    assert "revoked-keys" in err, err
    assert "0000000000" not in err, err
