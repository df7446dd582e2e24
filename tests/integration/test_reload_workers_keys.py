"""`serve --workers 2` (`state: memory`): a worker that could not read a changed keys
file (a key revoked) while its sibling read it. Before, it kept the older keys, stayed
ready and answered 200 to the revoked key while the sibling refused it 401, until its
retry (after 2, 4, ... 64 looks) read the file; now it is stale until a read of its
config files succeeds: 503 with `retry-after`, `/readyz` 503, re-read at every look.
Each worker is asked on connections it accepted, while it still cannot read: nothing
depends on which worker the kernel picks or on when the stale one looks again."""

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
from tests.helpers.worker_connections import WorkerConnection, connections_to_each

BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
ROUND = 16  # requests on new connections: both workers take some, whatever the kernel
AUTH = {"authorization": f"Bearer {KEY}"}


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


def _reloaded(stderr: str, index: int) -> bool:
    """Whether worker `index` logged a config reload (after its failed reads)."""
    return any(
        line.get("event") == "config reloaded" and line.get("worker") == index
        for line in _lines(stderr)
    )


def _round(url: str) -> list[httpx.Response]:
    headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        return [client.post("/v1/chat/completions", json=BODY) for _ in range(ROUND)]


def _worker_index(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"OWNGATE_WORKER_INDEX=")).split(b"=")[1])


def test_a_worker_that_could_not_read_a_revocation_refuses_until_it_does(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    keys = tmp_path / "keys.yaml"
    _write_keys(keys, [hash_api_key(KEY)])
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port(), "keepalive_timeout_s": 600},
        "logging": {"format": "json", "level": "info", "access_log": False},
        "limits": {"drain_timeout_s": 5},
        "keys_file": "keys.yaml",
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "models": ["*"]}],
    }
    gateway = GatewayProcess(config, tmp_path, "--workers", "2").start()
    held: dict[int, list[WorkerConnection]] = {}
    try:
        until(lambda: listening_sockets(gateway.port) == 2, "2 workers listening", timeout=60)
        assert {r.status_code for r in _round(gateway.url)} == {200}
        assert gateway.proc is not None
        stale, sibling = worker_pids(gateway.proc.pid)
        # Connections each worker accepted before: asked while the worker cannot open a
        # descriptor, and whichever worker the kernel would pick for a new one. Before,
        # the test asked on new connections after lifting the limit, racing the stale
        # worker's next look (1 s later it read the file): under load it had healed
        # before the requests came, and {401, 503} was {401}.
        held = connections_to_each(gateway.port, (stale, sibling), 4)
        index = _worker_index(stale)
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
            stale_answers = _ask_each(held[stale])
            sibling_answers = _ask_each(held[sibling])
        finally:
            resource.prlimit(stale, resource.RLIMIT_NOFILE, limits)
        chat, ready, listed = stale_answers
        # before: the revoked key served (200) by the worker that could not read the file
        assert (chat[0], ready[0], listed[0]) == (503, 503, 503), stale_answers
        assert chat[1]["retry-after"] == "1"
        assert "config" in json.loads(chat[2])["error"]["message"], chat
        assert [a[0] for a in sibling_answers] == [401, 200, 401], sibling_answers
        # At its next look (1 s) it reads the file: the key refused by both, both ready
        until(
            lambda: _reloaded(gateway.stderr()[before:], index),
            "the worker reading the file once it can",
            timeout=30,
            interval=0.05,
        )
        healed = held[stale][3]
        assert healed.ask("GET", "/readyz")[0] == 200
        assert healed.ask("POST", "/v1/chat/completions", BODY, AUTH)[0] == 401
        assert {r.status_code for r in _round(gateway.url)} == {401}
    finally:
        for connection in (c for conns in held.values() for c in conns):
            connection.close()
        gateway.stop(signal.SIGTERM)


def _ask_each(connections: list[WorkerConnection]) -> list[tuple[int, dict[str, str], bytes]]:
    """A chat request, `/readyz` and `/v1/models`, each on its own connection of one worker."""
    return [
        connections[0].ask("POST", "/v1/chat/completions", BODY, AUTH),
        connections[1].ask("GET", "/readyz"),
        connections[2].ask("GET", "/v1/models", headers=AUTH),
    ]
