"""Shared fixtures: simulators and gateways on real sockets, built from plain dicts."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.api import GatewayApp, create_app
from gateway.config import GatewayConfig
from gateway.keys import hash_api_key
from gateway.serving import ServerThread
from gateway.sim import SimApp, SimSettings, create_sim_app
from tests.real_backend.fixtures import real_llamacpp  # noqa: F401 - a fixture, used by name
from tests.redis_server import redis_server  # noqa: F401 - a fixture, used by name

TENANT_KEY = "og-test-tenant-key-0123456789"
OTHER_KEY = "og-test-other-tenant-key-98765"
ADMIN_TOKEN = "og-admin-test-token-0123456789"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN = {"token_hashes": [hash_api_key(ADMIN_TOKEN)]}  # the `admin` config of test gateways


@dataclasses.dataclass
class Sim:
    app: SimApp
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url


@dataclasses.dataclass
class Gateway:
    app: GatewayApp
    server: ServerThread
    key: str = TENANT_KEY

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}


def admin_status(url: str) -> dict[str, Any]:
    """`GET /admin/status` of the gateway at `url`, with the tests' admin token."""
    report: dict[str, Any] = httpx.get(
        f"{url}/admin/status", headers=ADMIN_HEADERS, timeout=10
    ).json()
    return report


def readiness(url: str) -> dict[str, Any]:
    """The readiness detail (backends, policy, provenance, state...) of the gateway at `url`."""
    detail: dict[str, Any] = admin_status(url)["readiness"]
    return detail


@pytest.fixture
def start_sim() -> Iterator[Callable[..., Sim]]:
    """Start simulators: `start_sim("llamacpp", models=("m",), decode_tokens_per_s=50)`."""
    started: list[ServerThread] = []

    def start(kind: str = "vllm", models: tuple[str, ...] = ("sim-model",), **changes: Any) -> Sim:
        settings = SimSettings.for_kind(kind, models=models)  # type: ignore[arg-type]
        settings = dataclasses.replace(settings, **changes)
        app = create_sim_app(settings)
        server = ServerThread(app).start()
        started.append(server)
        return Sim(app, server)

    yield start
    for server in started:
        server.stop()


def backend(
    id: str, url: str, *models: str | dict[str, Any], kind: str = "vllm", **extra: Any
) -> dict[str, Any]:
    entries = [{"name": m} if isinstance(m, str) else m for m in models]
    return {
        "id": id,
        "kind": kind,
        "base_url": url,
        "models": entries,
        "region": "eu-west-1",
        "owner": "test",
        **extra,
    }


def gateway_config(backends: list[dict[str, Any]], **extra: Any) -> GatewayConfig:
    data: dict[str, Any] = {
        "logging": {"format": "json", "level": "warning"},
        "backends": backends,
        "tenants": [
            {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]},
            {"id": "limited", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": []},
        ],
        "admin": ADMIN,
    }
    data.update(extra)
    return GatewayConfig.model_validate(data)


@pytest.fixture
def start_gateway() -> Iterator[Callable[..., Gateway]]:
    """Start a gateway in front of the given backend dicts (see `backend`); `clock`: what
    its backend health and breakers read (a test's fake clock)."""
    started: list[ServerThread] = []

    def start(
        backends: list[dict[str, Any]],
        environ: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        **extra: Any,
    ) -> Gateway:
        app = create_app(gateway_config(backends, **extra), environ=environ or {}, clock=clock)
        server = ServerThread(app).start()
        started.append(server)
        return Gateway(app, server)

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def sim_and_gateway(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> tuple[Sim, Gateway]:
    """One zero-latency vLLM-like simulator serving `sim-model` (alias `chat`)."""
    sim = start_sim("vllm", models=("sim-model", "embed-model"), zero_latency=True)
    gateway = start_gateway(
        [backend("gpu", sim.url, {"name": "sim-model", "aliases": ["chat"]}, "embed-model")]
    )
    return sim, gateway
