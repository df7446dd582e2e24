"""A gateway app whose backend `gpu` sits behind a `TLSFront` (tests/helpers/tls.py),
reloaded with other TLS settings while requests of older configs may still run: for the
tests of how a reload's TLS settings reach the pools of older configs
(tests/integration/test_backend_tls_pin_rotation.py, test_backend_tls_retired_pools.py).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gateway.api.app import GatewayApp
from gateway.app import create_app
from gateway.config.loader import load_config
from gateway.routing.registry import Registry
from gateway.tenants import hash_api_key
from gateway.upstream.http import HttpPool, UpstreamError
from tests.helpers.gateways import ADMIN, TENANT_KEY, Sim, backend
from tests.helpers.tls import Pki, TLSFront, server_context
from tests.helpers.waiting import until_async

__all__ = ["Rotation", "write_config"]


def write_config(
    tmp_path: Path, url: str | None, pins: list[str], spare: str | None = None, **gpu: Any
) -> Path:
    """gateway.yaml with one backend `gpu` at `url` (None: no `gpu`), trusting
    tmp_path/ca.pem and `pins`, and with `spare` a plain-HTTP backend `spare` at it."""
    tls = {"ca_file": "ca.pem", "pin_spki_sha256": pins}
    backends = [] if url is None else [backend("gpu", url, "m", kind="openai", tls=tls, **gpu)]
    if spare is not None:
        backends.append(backend("spare", spare, "m", kind="openai"))
    config = {
        "logging": {"format": "json", "level": "warning"},
        "backends": backends,
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": []}],
        "admin": ADMIN,
    }
    path = tmp_path / "gateway.yaml"
    partial = path.with_suffix(".tmp")
    partial.write_text(yaml.safe_dump(config))
    partial.replace(path)
    return path


class Rotation:
    """A backend behind a TLS front (certificate A or B of one CA) and a gateway app."""

    def __init__(self, start_sim: Callable[..., Sim], tmp_path: Path) -> None:
        self.sim = start_sim("vllm", models=("m",), zero_latency=True)
        pki = Pki.create(tmp_path / "pki")
        (tmp_path / "ca.pem").write_bytes(pki.ca.cert_pem)
        self.tmp_path = tmp_path
        a, b = pki.server(), pki.server()
        self.pin_a, self.pin_b = a.pin, b.pin
        self.a, self.b = server_context(pki, a), server_context(pki, b)
        self._fronts: list[TLSFront] = []
        self._held: list[tuple[asyncio.Event, asyncio.Task[bool]]] = []
        self.front = self.start_front(self.a)
        self.spare = f"http://{self.sim.server.host}:{self.sim.server.port}"
        self.registries: list[Registry] = []
        path = write_config(tmp_path, self.front.url, [self.pin_a])
        self.app: GatewayApp = create_app(
            load_config(path), environ={}, config_dir=tmp_path, config_file=path
        )

    def start_front(self, context: ssl.SSLContext) -> TLSFront:
        """Another TLS front to the same simulator (another port: the backend moved)."""
        front = TLSFront((self.sim.server.host, self.sim.server.port), context).start()
        self._fronts.append(front)
        return front

    def hold(self) -> None:
        """A request of the current config that runs until `close()`: a reload then
        closes the pools it retires only after `limits.drain_timeout_s` (540 s by default,
        longer than these tests take), as it would for a proxied request still running."""
        done = asyncio.Event()
        request = asyncio.create_task(done.wait())
        self.app.serving.add(request)
        self._held.append((done, request))

    def pool(self) -> HttpPool:
        """The current config's pool of `gpu` (the registry is kept for closing)."""
        self.registries.append(self.app.parts.registry)
        pool = self.app.parts.registry.backends["gpu"].pool
        assert pool is not None
        return pool

    async def reload(
        self, pins: list[str], *, url: str | None = "", spare: bool = False, **gpu: Any
    ) -> bool:
        """Whether gateway.yaml with `pins` (and `gpu` settings; `url` None: without `gpu`,
        "" at the first front; `spare`: with the plain backend) was a change to install."""
        where = self.front.url if url == "" else url
        write_config(self.tmp_path, where, pins, self.spare if spare else None, **gpu)
        assert self.app.reloader is not None
        return await self.app.reloader.reload()

    async def peer(self, pool: HttpPool, front: TLSFront | None = None) -> str | None:
        """The key of the connection `pool` hands out (None: refused as `tls`). Dropped by
        the front (`front`, default the first) then, so the next look makes a connection
        of its own."""
        try:
            connection = await pool.connect()
        except UpstreamError as exc:
            if exc.kind != "tls":
                raise
            return None
        assert connection.peer is not None
        key = connection.peer.spki_sha256
        front = self.front if front is None else front
        front.swap(front.context)
        await until_async(lambda: connection.closed, "the front to drop the connection", timeout=30)
        connection.release()
        return key

    async def close(self) -> None:
        for done, request in self._held:
            done.set()
            await request
            self.app.serving.discard(request)
        for registry in {id(r): r for r in (*self.registries, self.app.parts.registry)}.values():
            await registry.close()
        for front in self._fronts:
            front.stop()
