"""A policy directory that could not be listed or read (out of file descriptors) while a
reload read it is read again though nothing changed, and meanwhile a worker of `serve
--workers N` is stale. Before: the policy watcher's own stamp of the directory
(`policy_stamps`, `Path.rglob`) let the OSError escape the reload after the look had taken
the new stamp, so a narrowed policy waited for the files' next change; and a changed
gateway.yaml or keys file (a key revoked) whose assembly could not read its policy files
(the stamp's OSError, or the loader's unreadable file) was not read again either: the
revoked key stayed valid, the worker not stale."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import small_files
from gateway.app import create_app
from gateway.config import load_config
from gateway.policy import loader
from gateway.policy_set import TrustPolicies, policy_stamps
from gateway.tenants import hash_api_key
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.reload_files import versioned_policy, write
from tests.helpers.waiting import until_async

KEY = "og-policy-listing-test-key-0123456789"
WORKER_ENV = {"OWNGATE_WORKERS": "2", "OWNGATE_WORKER_INDEX": "1"}


class _Listings:
    """`os.scandir` out of file descriptors for the next `failing` listings made off the
    event loop's thread (a reload's worker thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failing: int) -> None:
        self.failing = failing
        self.failed = 0
        self.main = threading.get_ident()
        real = os.scandir

        def scandir(path: Any = ".") -> Any:
            if threading.get_ident() != self.main and self.failed < self.failing:
                self.failed += 1
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(path))
            return real(path)

        monkeypatch.setattr(os, "scandir", scandir)


def _policies(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    write(tmp_path / "policies" / "p.yaml", versioned_policy("1", '"*"'), 1_000_000_000)


def test_a_directory_that_cannot_be_listed_stamps_as_unlisted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.policy_set import UNLISTED  # imported here: the module's other tests run

    _policies(tmp_path)
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(path))

    monkeypatch.setattr(os, "scandir", scandir)
    assert policy_stamps([tmp_path / "policies"]) == (
        (str(tmp_path / "policies"), UNLISTED, -1, -1, -1),
    )
    monkeypatch.setattr(os, "scandir", real)
    assert [Path(s[0]).name for s in policy_stamps([tmp_path / "policies"])] == ["p.yaml"]


@pytest.mark.parametrize("worker", [False, True])
def test_a_narrowed_policy_whose_directory_could_not_be_listed_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker: bool
) -> None:
    """The policy watcher's own loop (`watch`): the reload (on its worker thread) finds
    the directory out of descriptors; until a listing succeeds it is read again, and a
    worker of several is stale meanwhile."""
    _policies(tmp_path)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["policies"]}
    )
    trust = TrustPolicies(config, tmp_path)
    trust.among_workers = worker
    trust.reload_interval_s = 0.005
    write(tmp_path / "policies" / "p.yaml", versioned_policy("2", "ap"), 2_000_000_000)
    listings = _Listings(monkeypatch, failing=1_000)

    async def run() -> None:
        watcher = asyncio.create_task(trust.watch())
        try:
            # before: 1 failure (unexpected error), then never read again
            await until_async(lambda: trust.reload_failures >= 2, "read again", timeout=20)
            assert trust.last_error is not None and "cannot read" in trust.last_error
            assert trust.stale is worker
            assert trust.current.compiled("p").version == "1"  # the last good set
            listings.failing = 0  # descriptors again
            narrowed = lambda: trust.current.compiled("p").version == "2"  # noqa: E731
            await until_async(narrowed, "the narrowed policy loaded", timeout=20)
            assert not trust.stale
        finally:
            watcher.cancel()

    asyncio.run(run())


def _gateway_yaml(tmp_path: Path) -> Path:
    data = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["policies"]}
    ).model_dump(mode="json", exclude_none=True)
    data["tenants"][0]["api_key_hashes"] = []
    data["keys_file"] = "keys.yaml"
    path = tmp_path / "gateway.yaml"
    write(path, yaml.safe_dump(data), 1_000_000_000)
    write(tmp_path / "keys.yaml", _keys(KEY), 1_000_000_000)
    return path


def _keys(*keys: str) -> str:
    return yaml.safe_dump({"tenants": {"acme": [hash_api_key(k) for k in keys]}})


def _failing_reads(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[Path]:
    """The policy loader's file reads, the first `failures` of them out of descriptors."""
    real = small_files.read_small_file
    reads: list[Path] = []

    def read(path: Path, limit: int) -> bytes:
        reads.append(path)
        if len(reads) <= failures:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(path, limit)

    monkeypatch.setattr(loader, "read_small_file", read)
    return reads


@pytest.mark.parametrize("fault", ["listing", "reading"])
@pytest.mark.parametrize("worker", [False, True])
def test_a_revocation_whose_policy_files_could_not_be_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, worker: bool
) -> None:
    """A key revoked in the keys file; assembling the new config finds its policy
    directory out of descriptors (its listing, or a file's read). Read again though
    nothing changed: the key is refused after the retry; a worker is stale meanwhile."""
    path = _gateway_yaml(tmp_path)
    _policies(tmp_path)
    environ = {**WORKER_ENV, "OWNGATE_WORKER_RUNTIME_DIR": str(tmp_path)} if worker else {}
    app = create_app(load_config(path), environ=environ, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None and reloader.among_workers is worker
    write(tmp_path / "keys.yaml", _keys(), 2_000_000_000)  # `owngate keys revoke`
    if fault == "listing":
        listings = _Listings(monkeypatch, failing=1)
    else:
        reads = _failing_reads(monkeypatch, failures=1)

    async def look() -> bool:
        return await reloader.poll()

    asyncio.run(look())  # the change seen
    asyncio.run(look())  # settled: assembled, and its policy files could not be read
    assert (listings.failed if fault == "listing" else len(reads)) == 1
    assert reloader.reload_failures == 1
    assert reloader.stale is worker
    assert hash_api_key(KEY) in app.parts.config.tenants[0].api_key_hashes  # not yet
    for _ in range(3):  # bounded: read again at the next look (a worker) or 2 looks later
        asyncio.run(look())
    assert reloader.reload_failures == 1
    assert hash_api_key(KEY) not in app.parts.config.tenants[0].api_key_hashes
    assert not reloader.stale


def test_a_config_whose_policy_reread_could_not_be_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config reload built its parts, then, before the swap, read its policy files
    again (the running set was reloaded meanwhile: a SIGHUP) and that read ran out of
    descriptors. Nothing is installed then (as before); before, it waited for the next
    change of a file, which may never come: the new config (a limit lowered) was never
    installed. Now it is read again though nothing changed."""
    (tmp_path / "policies").mkdir()
    write(tmp_path / "policies" / "p.yaml", versioned_policy("1", '"*"'), 1_000_000_000)
    probed, answer = asyncio.Event(), asyncio.Event()

    async def slow_backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        probed.set()
        await answer.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    async def scenario() -> tuple[bool, int | None, int | None, str | None]:
        server = await asyncio.start_server(slow_backend, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def text(concurrent: int) -> str:
            data = gateway_config(
                [backend("gpu", f"http://127.0.0.1:{port}", "m")],
                scrape={"timeout_s": 10.0, "staleness_s": 20.0},
                policy={"paths": ["policies"]},
            ).model_dump(mode="json", exclude_none=True)
            data["tenants"][0]["limits"] = {"concurrent_requests": concurrent}
            return yaml.safe_dump(data)

        path = tmp_path / "gateway.yaml"
        write(path, text(2), 1_000_000_000)
        app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
        reloader = app.reloader
        assert reloader is not None
        write(path, text(1), 2_000_000_000)  # a tenant's limit lowered
        reloading = asyncio.create_task(reloader.reload())
        await asyncio.wait_for(probed.wait(), 10.0)  # built, probing before the swap
        app.policies.reload()  # a SIGHUP meanwhile: the same files, read again
        reads = _failing_reads(monkeypatch, failures=1)  # the reload's re-read fails
        answer.set()
        installed = await asyncio.wait_for(reloading, 15.0)
        refused = app.parts.config.tenants[0].limits.concurrent_requests
        assert len(reads) == 1 and reloader.last_error is not None
        for _ in range(3):  # bounded: read again 2 looks later
            await reloader.poll()
        server.close()
        limit = app.parts.config.tenants[0].limits.concurrent_requests
        return installed, refused, limit, reloader.last_error

    installed, refused, limit, error = asyncio.run(scenario())
    assert not installed and refused == 2
    assert limit == 1, "the new config, refused for a read that failed, was never read again"
    assert error is None


def test_an_admin_listener_moved_in_a_reload_needs_a_restart_and_says_so(
    tmp_path: Path,
) -> None:
    """The admin listener is bound once, at start: a reload that narrows it (0.0.0.0 to
    127.0.0.1) or closes it (null) cannot move it. Before, the reload installed the new
    `admin.listen` without a word (the running config claimed 127.0.0.1 while the API
    still answered on every interface); now it keeps the running value and logs `needs
    restart`, as for `listen`. The admin tokens still reload (read per request)."""
    from structlog.testing import capture_logs

    def text(host: str | None, token: str) -> str:
        data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
            mode="json", exclude_none=True
        )
        listen = None if host is None else {"host": host, "port": 9191}
        data["admin"] = {"listen": listen, "token_hashes": [hash_api_key(token)]}
        return yaml.safe_dump(data)

    path = tmp_path / "gateway.yaml"
    write(path, text("0.0.0.0", "og-admin-old-token-0123456789"), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    running = app.parts.config.admin.listen
    for mtime, host in ((2_000_000_000, "127.0.0.1"), (3_000_000_000, None)):
        write(path, text(host, f"og-admin-token-{mtime}"), mtime)
        with capture_logs() as logs:
            assert asyncio.run(reloader.reload())  # the token change is installed
        admin = app.parts.config.admin
        assert admin.token_hashes == (hash_api_key(f"og-admin-token-{mtime}"),)
        assert admin.listen == running, "the running config claims a listener never bound"
        settings = [e.get("setting") for e in logs if "needs restart" in e["event"]]
        assert settings == ["admin.listen"]


def test_admin_access_added_in_a_reload_says_the_admin_api_needs_a_restart(
    tmp_path: Path,
) -> None:
    """`owngate serve` binds the admin listener at start only where some admin access is
    configured (tokens, token hashes or `allow_loopback`). A reload that adds the first
    token to a config whose `admin.listen` is set opens nothing: it says so (needs
    restart). Before, it logged `config reloaded` without a word while connections to
    admin.listen were refused (measured on `owngate serve` with SIGHUP)."""
    from structlog.testing import capture_logs

    def text(token: str | None) -> str:
        data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
            mode="json", exclude_none=True
        )
        data["admin"] = {"listen": {"host": "127.0.0.1", "port": 9191}}
        if token is not None:
            data["admin"]["token_hashes"] = [hash_api_key(token)]
        return yaml.safe_dump(data)

    path = tmp_path / "gateway.yaml"
    write(path, text(None), 1_000_000_000)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    write(path, text("og-admin-token-0123456789abcdef"), 2_000_000_000)
    with capture_logs() as logs:
        assert asyncio.run(reloader.reload())
    said = [e.get("setting") for e in logs if "needs restart" in e["event"]]
    assert said == ["admin.tokens"], "admin access added; the API it names never listened"
    admin = app.parts.config.admin
    assert admin.listen is None, "the running config claims an admin API never bound"
    assert admin.token_hashes == (hash_api_key("og-admin-token-0123456789abcdef"),)
    write(path, text("og-admin-token-abcdef0123456789"), 3_000_000_000)
    with capture_logs() as logs:  # still not listening: said at every reload
        assert asyncio.run(reloader.reload())
    said = [e.get("setting") for e in logs if "needs restart" in e["event"]]
    assert said == ["admin.listen"] and app.parts.config.admin.listen is None
