"""A backend's TLS files replaced on disk while the gateway runs (issue 15, layer 1).

An operator who withdraws a CA, or rotates the gateway's client certificate, replaces
the file that gateway.yaml names and reloads (SIGHUP, the admin API, or the file poll);
gateway.yaml itself does not change. The reload must rebuild that backend from the new
files: a gateway that kept trusting the withdrawn CA would go on sending requests to a
backend whose certificate it was told to refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.api.app import GatewayApp
from gateway.app import create_app
from gateway.config.loader import load_config
from gateway.tenants import hash_api_key
from gateway.upstream.http import UpstreamError
from tests.helpers.gateways import ADMIN, TENANT_KEY, Sim, backend
from tests.helpers.tls import Pki, TLSFront, server_context
from tests.helpers.waiting import until_async


@pytest.fixture
def sim(start_sim: Callable[..., Sim]) -> Sim:
    return start_sim("vllm", models=("m",), zero_latency=True)


@pytest.fixture
def front(sim: Sim, tmp_path: Path) -> Iterator[tuple[TLSFront, Pki]]:
    """A TLS front presenting a certificate of the CA `old`, whose ca.pem the gateway trusts."""
    old = Pki.create(tmp_path / "old", "old CA")
    started = TLSFront((sim.server.host, sim.server.port), server_context(old, old.server()))
    started.start()
    yield started, old
    started.stop()


def _write_config(tmp_path: Path, url: str, **gpu: Any) -> Path:
    """gateway.yaml with one backend `gpu` at `url`, trusting tmp_path/ca.pem."""
    tls = {"ca_file": "ca.pem"}
    config = {
        "logging": {"format": "json", "level": "warning"},
        "backends": [backend("gpu", url, "m", kind="openai", tls=tls, **gpu)],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": []}],
        "admin": ADMIN,
    }
    path = tmp_path / "gateway.yaml"
    partial = path.with_suffix(".tmp")
    partial.write_text(yaml.safe_dump(config))
    partial.replace(path)
    return path


def _app(tmp_path: Path, url: str, **gpu: Any) -> GatewayApp:
    """A gateway app reloading tmp_path/gateway.yaml, trusting the CA `old` at first."""
    (tmp_path / "ca.pem").write_bytes((tmp_path / "old" / "ca.pem").read_bytes())
    path = _write_config(tmp_path, url, **gpu)
    return create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)


async def _closed(app: GatewayApp, *registries: Any) -> None:
    """Close the pools of the registries the test saw (the retired one too: its retiring
    task may not have run yet)."""
    for registry in {id(r): r for r in (*registries, app.parts.registry)}.values():
        await registry.close()


async def _connects(app: GatewayApp, front: TLSFront) -> bool:
    """Whether a new connection to `gpu` is accepted (False: refused as `tls`). An
    accepted one is dropped by the front, so no TLS connection outlives the test's loop."""
    pool = app.parts.registry.backends["gpu"].pool
    assert pool is not None
    try:
        connection = await pool.connect()
    except UpstreamError as exc:
        if exc.kind != "tls":
            raise
        return False
    front.swap(front.context)
    await until_async(lambda: connection.closed, "the front to drop the connection")
    connection.release()
    return True


def _withdraw_the_old_ca(tmp_path: Path) -> None:
    # a longer name: another size, so the poll sees it also where mtimes are coarse
    new = Pki.create(tmp_path / "new", "the replacement CA")
    partial = tmp_path / "ca.pem.tmp"
    partial.write_bytes(new.ca.cert_pem)
    partial.replace(tmp_path / "ca.pem")  # atomic, as a deploy tool does it


def test_a_reload_after_the_ca_file_changed_stops_trusting_the_old_ca(
    front: tuple[TLSFront, Pki], tmp_path: Path
) -> None:
    app = _app(tmp_path, front[0].url)
    assert app.reloader is not None
    reloader = app.reloader
    before = app.parts.registry

    async def run() -> None:
        try:
            assert await _connects(app, front[0])
            _withdraw_the_old_ca(tmp_path)
            assert await reloader.reload()  # gateway.yaml is the same; its CA file is not
            assert not await _connects(app, front[0])
        finally:
            await _closed(app, before)

    asyncio.run(run())


def test_the_file_poll_sees_a_ca_file_replaced(front: tuple[TLSFront, Pki], tmp_path: Path) -> None:
    app = _app(tmp_path, front[0].url)
    assert app.reloader is not None
    reloader = app.reloader
    reloader.interval_s = 0.02
    before = app.parts

    async def run() -> None:
        watching = asyncio.create_task(reloader.watch())
        try:
            _withdraw_the_old_ca(tmp_path)
            await until_async(lambda: app.parts is not before, "the poll to reload")
            assert not await _connects(app, front[0])
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await _closed(app, before.registry)

    asyncio.run(run())


def test_a_reload_with_nothing_changed_keeps_the_backend(
    front: tuple[TLSFront, Pki], tmp_path: Path
) -> None:
    app = _app(tmp_path, front[0].url)
    assert app.reloader is not None
    reloader = app.reloader
    kept: Any = app.parts.registry.backends["gpu"]

    async def run() -> None:
        try:
            assert not await reloader.reload()
            assert app.parts.registry.backends["gpu"] is kept
            assert await _connects(app, front[0])
        finally:
            await _closed(app)

    asyncio.run(run())


def test_requests_running_at_the_reload_no_longer_trust_the_withdrawn_ca(
    front: tuple[TLSFront, Pki], tmp_path: Path
) -> None:
    # A request that began before the reload finishes on the old registry (its plan holds
    # the old backend): a failover attempt of it connects, or takes an idle connection,
    # from the old pool. Neither may trust the CA the reload withdrew.
    app = _app(tmp_path, front[0].url)
    assert app.reloader is not None
    reloader = app.reloader
    old = app.parts.registry
    pool = old.backends["gpu"].pool
    assert pool is not None

    async def run() -> None:
        try:
            idle = await pool.connect()  # authenticated under the old CA, then idle
            held = await pool.connect()  # held by a request across the reload
            idle.release()
            _withdraw_the_old_ca(tmp_path)
            assert await reloader.reload()
            assert pool.open_connections == 1  # the idle one is closed; the held one not
            held.release()  # its request ended: closed, not pooled for the next
            assert pool.open_connections == 0
            with pytest.raises(UpstreamError) as caught:
                await pool.connect()
            assert caught.value.kind == "tls"
            assert "certificate verify failed" in caught.value.detail
        finally:
            await _closed(app, old)

    asyncio.run(run())


def test_requests_running_at_the_reload_still_need_the_facts_they_were_decided_on(
    sim: Sim, tmp_path: Path
) -> None:
    # Decided while gpu had `identity: certificate` (a policy may have required it), a
    # running request's failover must still find the certificate stating those facts,
    # also after a reload that dropped the requirement: only what both settings accept.
    pki = Pki.create(tmp_path / "old", "old CA")
    silent = pki.server()  # chains, names 127.0.0.1, states no facts
    front = TLSFront((sim.server.host, sim.server.port), server_context(pki, silent)).start()
    try:
        attested = {"identity": "certificate", "retention": {"days": 0}}
        app = _app(tmp_path, front.url, **attested)
        assert app.reloader is not None
        reloader = app.reloader
        old = app.parts.registry
        pool = old.backends["gpu"].pool
        assert pool is not None

        async def run() -> None:
            # A request decided under the old config still runs: the reload keeps its pool
            # open (until `limits.drain_timeout_s`), so its failover may still connect.
            done = asyncio.Event()
            request = asyncio.create_task(done.wait())
            app.serving.add(request)
            try:
                assert not await _connects(app, front)  # states no region
                _write_config(tmp_path, front.url)  # identity: declared
                assert await reloader.reload()
                assert await _connects(app, front)  # new requests: declared facts only
                with pytest.raises(UpstreamError) as caught:
                    await pool.connect()
                assert caught.value.detail.startswith("the certificate states no region")
            finally:
                done.set()
                await request
                await _closed(app, old)

        asyncio.run(run())
    finally:
        front.stop()
