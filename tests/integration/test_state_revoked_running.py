"""A running gateway honours this host's revoked keys list as it changes: each process
(each worker of `serve --workers N`) looks at the list every second and refuses what was
added since (`owngate keys revoke` without Redis, for a key gateway.yaml itself lists: only
the list changes). Before, the list was read only at start: such a key kept working in
every running process until its restart. A list found damaged while running stops
tenant requests (503, saying why) until it can be read again, never the keys it may
revoke; with Redis, a revocation learned there is enforced only once the list holds it,
so a `kill -9` after the first refusal cannot take it off the list."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.exceptions
import yaml

from gateway.api import GatewayApp
from gateway.app import create_app
from gateway.cli.main import main
from gateway.config import load_config
from gateway.serving import ServerThread
from gateway.state.revocation_keeper import KeptRevocations
from gateway.state.revocation_list import read_revocations, render_revocations
from gateway.tenants import hash_api_key
from tests.helpers.gateways import ADMIN, Sim, backend, readiness
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess, listening_sockets
from tests.helpers.redis_server import RedisServer, replica
from tests.helpers.waiting import until, until_async

DOOMED = "og-running-doomed-key-0123456789"
KEPT = "og-running-kept-key-0123456789ab"
BODY = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
ROUND = 16  # requests on new connections: both workers take some, whatever the kernel


def _config(sim: Sim) -> dict[str, Any]:
    hashes = [hash_api_key(DOOMED), hash_api_key(KEPT)]
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "models": ["*"], "api_key_hashes": hashes}],
    }


def _statuses(url: str, key: str, count: int = 1) -> list[int]:
    headers = {"authorization": f"Bearer {key}", "connection": "close"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        return [client.post("/v1/chat/completions", json=BODY).status_code for _ in range(count)]


def _revoke_here(config: Path, key: str) -> None:
    """`owngate keys revoke` on this host, no Redis: gateway.yaml lists the key, so only
    this host's list takes it (exit 1 says the key is still in gateway.yaml)."""
    assert main(["keys", "revoke", key, "--config", str(config)]) == 1
    assert hash_api_key(key) in read_revocations(config.parent / "revoked-keys")


@pytest.fixture
def gateway(tmp_path: Path, start_sim: Callable[..., Sim]) -> Iterator[tuple[GatewayApp, str]]:
    """An in-process gateway (memory state) whose list is `tmp_path / "revoked-keys"`."""
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(_config(start_sim("vllm", models=("m",), zero_latency=True))))
    app = create_app(load_config(path), environ={}, config_dir=tmp_path)
    server = ServerThread(app).start()
    try:
        yield app, server.url
    finally:
        server.stop()


def test_a_running_gateway_refuses_a_key_revoked_on_the_host(
    gateway: tuple[GatewayApp, str], tmp_path: Path
) -> None:
    _, url = gateway
    assert _statuses(url, DOOMED) == [200]
    _revoke_here(tmp_path / "gateway.yaml", DOOMED)
    # before: 200 until a restart (the list was read only at start)
    until(lambda: _statuses(url, DOOMED) == [401], "the running gateway refusing the key")
    assert _statuses(url, KEPT) == [200]


def test_a_list_damaged_while_running_stops_requests_and_says_why(
    gateway: tuple[GatewayApp, str], tmp_path: Path
) -> None:
    app, url = gateway
    listed = tmp_path / "revoked-keys"
    written = render_revocations([hash_api_key(DOOMED)])
    listed.write_bytes(written[: written.index(b"\nend ") + 1])  # cut short
    # before: the list was never read again, every key served as before
    until(lambda: _statuses(url, KEPT) == [503], "requests refused while the list is damaged")
    answer = httpx.post(
        f"{url}/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {KEPT}"}
    )
    error = answer.json()["error"]
    assert error["code"] == "not_ready" and "revoked API keys" in error["message"], error
    assert "revoked-keys" not in error["message"]  # the host's paths are the operator's
    assert answer.headers["retry-after"] == "1"
    assert httpx.get(f"{url}/readyz").status_code == 503
    reason = app.parts.state.status().detail()["revocations_list_error"]
    assert isinstance(reason, str) and "revoked-keys" in reason, reason
    listed.write_bytes(written)  # restored: what it holds is refused, the rest served
    until(lambda: _statuses(url, KEPT) == [200], "requests served again once it is restored")
    assert _statuses(url, DOOMED) == [401]
    assert httpx.get(f"{url}/readyz").status_code == 200
    listed.write_bytes(b"not a list\n")
    until(lambda: _statuses(url, KEPT) == [503], "refused again: damaged again")
    listed.unlink()  # the other way out: the revocations known here stay
    until(lambda: _statuses(url, KEPT) == [200], "requests served again once it is removed")
    assert _statuses(url, DOOMED) == [401]


def test_workers_of_a_running_gateway_refuse_a_key_revoked_on_the_host(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    config = _config(start_sim("vllm", models=("m",), zero_latency=True))
    gateway = GatewayProcess(config, tmp_path, "--workers", "2").start()
    try:
        until(lambda: listening_sockets(gateway.port) == 2, "2 workers listening", timeout=60)
        assert set(_statuses(gateway.url, DOOMED, ROUND)) == {200}
        _revoke_here(gateway.path, DOOMED)
        # each worker reads the list: all refuse it (before: all served it until restart)
        until(
            lambda: set(_statuses(gateway.url, DOOMED, ROUND)) == {401},
            "both workers refusing the key",
            detail=gateway.output,
        )
        assert set(_statuses(gateway.url, KEPT, ROUND)) == {200}
    finally:
        gateway.stop(signal.SIGTERM)


@pytest.mark.redis
def test_a_revocation_learned_from_redis_is_enforced_once_listed(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Its write to the list is held up (the test holds the list's lock, and the state
    waits up to a minute for it): the revocation is not enforced until the write ends, so
    a process that refused the key has it on the list. Before, it was enforced at once and
    written in the background: a `kill -9` meanwhile left a revocation it had enforced off
    the list, and a restart while Redis was down served the key again."""
    path = tmp_path / "revoked-keys"
    holder = _hold_lock(tmp_path / ".revoked-keys.lock")
    digest = hash_api_key(DOOMED)

    async def scenario() -> None:
        here = replica(
            redis_server, "here", lease_ttl_s=5.0, kept=KeptRevocations(path, lock_wait_s=60.0)
        )
        other = replica(redis_server, "other")
        await here.start()
        await other.start()
        try:
            assert await other.revoke_key(digest)
            await until_async(
                lambda: here.status().unlisted_revocations == 1, "learned, its write held up"
            )
            assert not here.is_revoked(digest)  # before: refused, and not on the list
            assert not path.exists()
            os.close(holder)  # the lock released: the write goes on
            await until_async(lambda: here.is_revoked(digest), "refused once listed")
            assert digest in read_revocations(path)
        finally:
            with contextlib.suppress(OSError):  # closed already
                os.close(holder)
            await other.close()
            await here.close()

    asyncio.run(scenario())


@pytest.mark.redis
def test_a_revocation_learned_from_redis_is_enforced_whatever_sits_at_the_lock(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A FIFO where the list's lock file goes (whoever may write the directory put it
    there): the write of a revocation learned from Redis fails at once, and the key is
    refused (said unlisted). Before, opening the FIFO waited for a writer for good: the
    revocation, enforced only once its write ends, was never enforced in this process,
    while every other replica refused the key."""
    lock = tmp_path / ".revoked-keys.lock"
    os.mkfifo(lock)
    digest = hash_api_key(DOOMED)

    async def scenario() -> None:
        here = replica(
            redis_server, "here", lease_ttl_s=5.0, kept=KeptRevocations(tmp_path / "revoked-keys")
        )
        other = replica(redis_server, "other")
        await here.start()
        await other.start()
        try:
            assert await other.revoke_key(digest)
            await until_async(lambda: here.is_revoked(digest), "refused, its write failed")
            assert here.status().unlisted_revocations == 1
        finally:
            with contextlib.suppress(OSError):  # before: frees the write waiting on it
                os.close(os.open(lock, os.O_WRONLY | os.O_NONBLOCK))
            await other.close()
            await here.close()

    asyncio.run(scenario())


@pytest.mark.redis
def test_a_revocation_learned_in_a_sync_that_then_fails_is_still_enforced(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Redis flapping: a sync reads a revocation made on another host, then its push of
    one made here while Redis was away fails (the connection dropped: a stand-in fails
    every push). The revocation read is written to the list and enforced all the same.
    Before, it was held for the list, but the failure ended the sync before it was handed
    to the list's writer, and no later sync learned it again (already held): the key
    stayed served by this process until its restart."""
    digest, mine = hash_api_key(DOOMED), hash_api_key(KEPT)

    async def scenario() -> None:
        here = replica(
            redis_server, "here", lease_ttl_s=5.0, kept=KeptRevocations(tmp_path / "revoked-keys")
        )
        other = replica(redis_server, "other")
        await here.start()
        await other.start()
        revoked = here._revocations
        push = revoked._script
        failed = [0]

        async def dropped(*args: Any, **kwargs: Any) -> Any:
            failed[0] += 1
            raise redis.exceptions.ConnectionError("connection dropped (the test's)")

        try:
            revoked._script = dropped  # type: ignore[assignment]  # Redis drops each push
            await here.revoke_key(mine, share=False)  # made here: pushed by the next sync
            assert await other.revoke_key(digest)
            # Each sync from now on pushes `mine` and fails: the one that reads `digest` too.
            await until_async(lambda: here.is_revoked(digest), "refused: listed after all")
            assert failed[0] >= 1 and not here.healthy
            assert digest in read_revocations(tmp_path / "revoked-keys")
        finally:
            revoked._script = push
            await other.close()
            await here.close()

    asyncio.run(scenario())


def _hold_lock(lock: Path) -> int:
    """A descriptor holding the list's lock (`flock`, as `add_revocations` takes it):
    each write of the list waits for it until it is closed (or its wait ends)."""
    holder = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)
    return holder


def test_a_reload_moving_the_list_says_it_needs_a_restart(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """`state.revocations_file` changed in a reload: the running processes keep the list
    they read at start (the state is built once), and the reload says so: logged with the
    field, and listed in the config status (`needs_restart`, in `/admin/v1/config` and the
    readiness detail) until the file no longer changes it. Before, it logged "needs
    restart" for `state` as a whole, and nothing showed it afterwards."""
    from structlog.testing import capture_logs

    config = _config(start_sim("vllm", models=("m",), zero_latency=True))
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    path.write_text(yaml.safe_dump({**config, "state": {"revocations_file": "moved"}}))
    with capture_logs() as logs:
        asyncio.run(reloader.reload())
    said = [(e.get("setting"), e.get("fields")) for e in logs if "needs restart" in e["event"]]
    assert said == [("state", ["revocations_file"])], said
    assert reloader.status()["needs_restart"] == ["state.revocations_file"]
    assert app.config.state.revocations_file == "revoked-keys"  # the running value, kept
    path.write_text(yaml.safe_dump(config))
    asyncio.run(reloader.reload())
    assert reloader.status()["needs_restart"] == []


@pytest.mark.redis
def test_a_gateway_killed_after_refusing_a_key_learned_from_redis_still_refuses_it(
    start_sim: Callable[..., Sim], redis_server: RedisServer, tmp_path: Path
) -> None:
    """`kill -9` right after the gateway first refused a key revoked on another host
    through Redis, then a restart while Redis is down: the key is still refused. Its
    list write is held up (the test holds the list's lock) until the gateway has learned
    the revocation (the readiness detail's `unlisted_revocations`); before, it refused the
    key at once with the write still waiting, and the restart served the key (200). The
    gateway waits `LOCK_WAIT_S` for the lock: a test slower than that sees the write fail
    (the key refused, said unlisted) and waits for its retry to list it before the kill."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    redis = {"backend": "redis", "url": redis_server.url, "key_prefix": "test"}
    state = {**redis, "timeout_ms": 200, "sync_interval_s": 0.05, "lease_ttl_s": 1}
    config = {**_config(sim), "admin": ADMIN, "state": state}
    other = tmp_path / "other"
    other.mkdir()
    (other / "gateway.yaml").write_text(yaml.safe_dump(config))
    here = tmp_path / "here"
    here.mkdir()
    holder = _hold_lock(here / ".revoked-keys.lock")
    gateway = GatewayProcess(config, here).start()
    try:
        assert _statuses(gateway.url, DOOMED) == [200]
        assert main(["keys", "revoke", DOOMED, "--config", str(other / "gateway.yaml")]) == 0
        until(
            lambda: readiness(gateway.url)["state"]["unlisted_revocations"] == 1,
            "the gateway learned the revocation; its list write is held up",
            detail=gateway.output,
        )
        assert _statuses(gateway.url, DOOMED) in ([200], [401])  # 401: its wait ended
        os.close(holder)  # the lock released: the write goes on
        until(lambda: _statuses(gateway.url, DOOMED) == [401], "refused once listed")
        if readiness(gateway.url)["state"]["unlisted_revocations"]:  # its wait ended first
            until(
                lambda: readiness(gateway.url)["state"]["unlisted_revocations"] == 0,
                "the failed write retried",
                detail=gateway.output,
            )
        gateway.stop(signal.SIGKILL)  # at once: it refused the key
        redis_server.stop()
        gateway.start()  # Redis down: it starts degraded, from this host's list
        assert _statuses(gateway.url, DOOMED) == [401]  # before: 200, off the list
        assert _statuses(gateway.url, KEPT) == [200]
    finally:
        with contextlib.suppress(OSError):  # closed already
            os.close(holder)
        gateway.stop(signal.SIGKILL)
