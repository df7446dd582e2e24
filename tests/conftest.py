"""Shared fixtures: simulators and gateways on real sockets, built from plain dicts."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.api import GatewayApp
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.provenance import LogDirectory, write_signing_key
from gateway.serving import ServerThread
from gateway.sim import SimApp, SimSettings, create_sim_app
from gateway.tenants import hash_api_key
from tests.raw_backend import Answer, RawBackend
from tests.real_backend.fixtures import real_llamacpp  # noqa: F401 - a fixture, used by name
from tests.redis_server import redis_server  # noqa: F401 - a fixture, used by name

TENANT_KEY = "og-test-tenant-key-0123456789"
OTHER_KEY = "og-test-other-tenant-key-98765"
ADMIN_TOKEN = "og-admin-test-token-0123456789"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN = {"token_hashes": [hash_api_key(ADMIN_TOKEN)]}  # the `admin` config of test gateways
# A backend's facts that every EU, zero-retention policy of the tests admits.
EU_ZERO: dict[str, Any] = {
    "region": "eu-west-1",
    "retention": {"days": 0, "zero_data_retention": True},
}
# Only the hosted backend `hosted` serves: the private ones are never eligible.
HOSTED_ONLY_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: hosted-only, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted}]
"""


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


def hosted_backend(id: str, url: str, *models: str, **facts: Any) -> dict[str, Any]:
    """An OpenAI-shaped hosted backend at `url` (a simulator's `/v1`), keyed by the
    `HOSTED_KEY` variable, serving `models` as `openai/<name>`; EU and zero retention
    unless `facts` say otherwise."""
    return {
        "id": id,
        "kind": "hosted",
        "provider": "openai",
        "base_url": url,
        "api_key_env": "HOSTED_KEY",
        "owner": "provider",
        "models": [{"name": m, "provider_model": f"openai/{m}"} for m in models],
        **{**EU_ZERO, **facts},
    }


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


@pytest.fixture
def start_raw() -> Iterator[Callable[[Answer], RawBackend]]:
    """Start scripted raw-socket backends (see tests/raw_backend.py)."""
    started: list[RawBackend] = []

    def start(answer: Answer) -> RawBackend:
        raw = RawBackend(answer).start()
        started.append(raw)
        return raw

    yield start
    for raw in started:
        raw.stop()


def logged_private_gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, url: str, origin: str, **extra: Any
) -> Gateway:
    """A gateway in front of one private backend `gpu` at `url` serving `m`, with the
    provenance log on in `tmp_path / "log"` (key `tmp_path / "log.key"`)."""
    write_signing_key(tmp_path / "log.key", origin)
    provenance = {
        "dir": str(tmp_path / "log"),
        "origin": origin,
        "signing_key_file": str(tmp_path / "log.key"),
        "checkpoint_interval_ms": 20,
    }
    return start_gateway([backend("gpu", url, "m")], provenance=provenance, **extra)


def completion_record(log_dir: Path, request_id: str) -> dict[str, Any]:
    """The completion record of `request_id`, once a checkpoint covers it."""
    deadline = time.monotonic() + 20
    while True:
        directory = LogDirectory(log_dir)
        total = int(directory.latest_note().decode().split("\n")[1])
        for entry in directory.bundle(0, total) if total else ():
            record = orjson.loads(entry)
            if record["type"] == "completion" and record["request_id"] == request_id:
                return dict(record)
        assert time.monotonic() < deadline, "no completion record in time"
        time.sleep(0.02)


def served(sim: Sim) -> int:
    """Chat completions a simulator has been sent (a private backend or a hosted one)."""
    return len(sim.app.captured("/v1/chat/completions"))
