"""A running gateway's watch of this host's revoked keys list when the host misbehaves
(gateway/state/revocation_keeper.py): a look that hangs (a hard NFS mount gone away)
stops tenant requests within its bound and says why; a list the host could not open
for want of descriptors keeps being enforced as last read, requests served; a list
restored from an older backup while the gateway runs gets the revocations it lost
written back, so a restart (Redis down, or none) still refuses those keys.
`/metrics` says a damaged list and counts rollbacks."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway import small_files
from gateway.app import create_app
from gateway.cli.main import main
from gateway.config import load_config
from gateway.serving import ServerThread
from gateway.state import revocation_keeper, revocation_list
from gateway.state.revocation_keeper import KeptRevocations
from gateway.state.revocation_list import add_revocations, read_revocations, render_revocations
from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.redis_server import RedisServer, replica
from tests.helpers.waiting import until, until_async

DOOMED = "og-watch-doomed-key-0123456789ab"
KEPT = "og-watch-kept-key-0123456789abcd"
BODY = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
def config(tmp_path: Path, start_sim: Callable[..., Sim]) -> Path:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    hashes = [hash_api_key(DOOMED), hash_api_key(KEPT)]
    path = tmp_path / "gateway.yaml"
    settings: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "models": ["*"], "api_key_hashes": hashes}],
    }
    path.write_text(yaml.safe_dump(settings))
    return path


class Gateway:
    """An in-process gateway (memory state) on `config`, started again by `restart`."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.list = config.parent / "revoked-keys"
        self._server: ServerThread | None = None
        self.url = ""
        self.restart()

    def restart(self) -> None:
        self.stop()
        self.app = create_app(load_config(self.config), environ={}, config_dir=self.config.parent)
        self._server = ServerThread(self.app).start()
        self.url = self._server.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def status(self, key: str) -> int:
        headers = {"authorization": f"Bearer {key}", "connection": "close"}
        return httpx.post(f"{self.url}/v1/chat/completions", json=BODY, headers=headers).status_code

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")


@pytest.fixture
def gateway(config: Path) -> Iterator[Gateway]:
    running = Gateway(config)
    try:
        yield running
    finally:
        running.stop()


def _revoke_here(gateway: Gateway, key: str) -> None:
    """`owngate keys revoke` on this host, no Redis (gateway.yaml lists the key: exit 1)."""
    assert main(["keys", "revoke", key, "--config", str(gateway.config)]) == 1
    assert hash_api_key(key) in read_revocations(gateway.list)


def test_a_list_restored_from_an_older_backup_loses_no_revocation(gateway: Gateway) -> None:
    """Before, the running gateway kept refusing the key but never wrote it back: the
    list stayed without it, and the next start (here with memory state; with Redis, one
    while Redis is down) served the key again: 200."""
    backup = gateway.list.with_name("revoked-keys.bak")
    backup.write_bytes(render_revocations([]))  # a backup older than the revocation
    _revoke_here(gateway, DOOMED)
    until(lambda: gateway.status(DOOMED) == 401, "the running gateway refusing the key")
    os.replace(backup, gateway.list)  # the backup restored over the list
    until(
        lambda: hash_api_key(DOOMED) in read_revocations(gateway.list),
        "the revocation the backup lacks written back",
    )
    assert gateway.status(DOOMED) == 401 and gateway.status(KEPT) == 200
    assert gateway.metric("owngate_state_revocations_list_rollbacks_total") == 1
    gateway.restart()
    assert gateway.status(DOOMED) == 401  # before: 200
    assert gateway.status(KEPT) == 200


def test_a_look_that_hangs_stops_requests_and_says_why(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list's read blocks (as on a hard NFS mount gone away) until the test lets it
    go. Before, the watch's look waited for it for good: requests were served, a key
    revoked meanwhile stayed served, and nothing said so."""
    # Short enough to wait for, long enough that a look on a busy machine never takes
    # it (the checks after the release would see a 503)
    monkeypatch.setattr(revocation_keeper, "LOOK_LIMIT_S", 2.0, raising=False)
    gateway.restart()  # its keeper made with the shorter bound
    release, began = threading.Event(), threading.Event()
    read = read_revocations

    def hung(path: Path) -> frozenset[str]:
        began.set()
        release.wait()
        return read(path)

    monkeypatch.setattr(revocation_keeper, "read_revocations", hung)
    try:
        _revoke_here(gateway, DOOMED)  # the list changed: the next look reads it, and hangs
        assert began.wait(30)
        until(lambda: gateway.status(KEPT) == 503, "requests refused while the look hangs")
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json=BODY,
            headers={"authorization": f"Bearer {KEPT}"},
        )
        error = answer.json()["error"]
        assert error["code"] == "not_ready" and "revoked API keys" in error["message"]
        assert "restores" not in error["message"]  # the list may be fine: the host hangs
        assert gateway.metric("owngate_state_revocations_list_damaged") == 1
        assert httpx.get(f"{gateway.url}/readyz").status_code == 503
        reason = gateway.app.parts.state.status().revocations_list_error
        assert reason is not None and "has not ended within 2 s" in reason, reason
    finally:
        release.set()
    until(lambda: gateway.status(KEPT) == 200, "served again once the look ends")
    assert gateway.status(DOOMED) == 401  # what the hung read held, enforced
    assert gateway.metric("owngate_state_revocations_list_damaged") == 0


def test_a_list_the_host_cannot_open_now_keeps_requests_served(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`EMFILE` on opening the list at a look: before, every tenant request was refused
    (503, telling the operator to restore a list that was fine) until a look succeeded.
    Now the last good list stays enforced and requests are served; the list is read
    again at the next look, and what it gained is refused then. (The look limit, past
    which a list that cannot be opened counts as damaged, is made an hour: the checks
    below never race it on a busy machine.)"""
    monkeypatch.setattr(revocation_keeper, "LOOK_LIMIT_S", 3600.0, raising=False)
    gateway.restart()  # its keeper made with that bound
    _revoke_here(gateway, DOOMED)
    until(lambda: gateway.status(DOOMED) == 401, "the running gateway refusing the key")
    real = small_files.read_small_file
    failing, failed = threading.Event(), threading.Event()
    failing.set()

    def out_of_descriptors(where: Path, limit: int) -> bytes:
        if failing.is_set():
            failed.set()
            raise OSError(errno.EMFILE, "Too many open files", str(where))
        return real(where, limit)

    monkeypatch.setattr(revocation_list, "read_small_file", out_of_descriptors)
    other = hash_api_key("og-watch-other-key-0123456789abc")
    staged = gateway.list.with_name("staged")
    staged.write_bytes(render_revocations({hash_api_key(DOOMED), other}))
    os.replace(staged, gateway.list)  # the list changed: read at the next look
    assert failed.wait(30)  # a look met EMFILE
    assert gateway.status(KEPT) == 200  # before: 503 "until the operator restores the list"
    assert gateway.status(DOOMED) == 401  # the last good list, still enforced
    assert gateway.metric("owngate_state_revocations_list_damaged") == 0
    failing.clear()
    state = gateway.app.parts.state
    until(lambda: state.is_revoked(other), "the list read again once it can be opened")
    assert gateway.status(KEPT) == 200


@pytest.mark.redis
def test_a_revocation_learned_from_redis_is_enforced_while_the_list_write_hangs(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list's write blocks for good (a filesystem whose writes hang while `stat` is
    answered from a cache). A revocation learned from Redis is enforced once its write
    ends: before, that was never, and this replica served the key while every other one
    refused it. Now a write not ended within its lock wait and the look limit holds it
    back no longer; once the write ends the list holds it."""
    path = tmp_path / "revoked-keys"
    release, began = threading.Event(), threading.Event()

    def hung(where: Path, digests: set[str], *, wait_s: float) -> int:
        began.set()
        release.wait()
        return add_revocations(where, digests, wait_s=wait_s)

    monkeypatch.setattr(revocation_keeper, "add_revocations", hung)
    digest = hash_api_key(DOOMED)

    async def scenario() -> None:
        kept = KeptRevocations(path, lock_wait_s=0.5, look_limit_s=0.5)
        here = replica(redis_server, "here", lease_ttl_s=5.0, kept=kept)
        other = replica(redis_server, "other")
        await here.start()
        await other.start()
        try:
            assert await other.revoke_key(digest)
            await until_async(lambda: here.is_revoked(digest), "refused while its write hangs")
            assert began.is_set() and not path.exists()
        finally:
            release.set()  # before: frees the write, so the state can close
            await other.close()
            await here.close()

    asyncio.run(scenario())
    assert digest in read_revocations(path)
