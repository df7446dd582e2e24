"""Fixtures only: simulators, gateways and raw backends on real sockets, `owngate serve`
processes, a private redis-server, a real llama.cpp server; and the collection checks
below. A marked test whose prerequisite is absent fails in the helper that reaches for it
(tests/helpers/prerequisites.py).

What the fixtures are built from (keys, `backend`, `gateway_config`...) lives in
tests/helpers/; test modules import it from there. Which test goes where (tests/README.md):
tests/unit/ opens no socket and starts no process, tests/integration/ does (or needs
Redis, llama.cpp or a deploy tool), tests/vectors/ checks data from other implementations;
collection refuses a unit test that uses a fixture of the integration layer.
"""

from __future__ import annotations

import dataclasses
import gc
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gateway.app import create_app
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app
from gateway.tenants import hash_api_key
from tests.helpers.gateways import ADMIN, Gateway, Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.prerequisites import real_backend, real_smollm2, redis_binary
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.real_backend import prewarm
from tests.helpers.real_backend.server import LlamaServer, running_llama_server
from tests.helpers.redis_server import RedisServer


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic collector off while a test runs (tests/helpers/cycles.py `holders`
    then finds what a cycle holds), everything it saved dropped after."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.fixture
def collector() -> Iterator[None]:
    """Give the test process its collector back as it was (frozen objects, thresholds)
    after a test of what `settle_heap` does to it."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


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
    """Start scripted raw-socket backends (see tests/helpers/raw_backend.py)."""
    started: list[RawBackend] = []

    def start(answer: Answer) -> RawBackend:
        raw = RawBackend(answer).start()
        started.append(raw)
        return raw

    yield start
    for raw in started:
        raw.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server on a free port, for this test (marker `redis`)."""
    server = RedisServer(redis_binary(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def real_llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A running llama-server with the tiny model, alias ``tiny``, 4 slots of 1024 tokens
    (room for a short prompt plus ~900 generated tokens), ``--metrics`` (marker
    `real_backend`)."""
    with running_llama_server(
        real_backend(),
        alias="tiny",
        slots=4,
        ctx_size=4096,
        log_dir=tmp_path_factory.mktemp("llama-server"),
    ) as server:
        yield server


@pytest.fixture(scope="session")
def real_smollm2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A running llama-server with the real SmolLM2-135M-Instruct (F16), alias ``smollm2``,
    one slot of 2048 tokens (marker `real_backend`; loading takes a few seconds)."""
    installation = real_smollm2()
    assert installation.smollm2_model is not None
    with running_llama_server(
        installation,
        model=installation.smollm2_model,
        alias="smollm2",
        slots=1,
        ctx_size=2048,
        log_dir=tmp_path_factory.mktemp("llama-server-smollm2"),
    ) as server:
        yield server


@pytest.fixture
def process(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[Callable[..., GatewayProcess]]:
    """`owngate serve` processes (not started) in `tmp_path` over one simulator serving `m`;
    `extra`: more config. Killed at the end."""
    started: list[GatewayProcess] = []

    def make(**extra: Any) -> GatewayProcess:
        sim = start_sim("vllm", models=("m",), zero_latency=True)
        config: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": free_port()},
            "logging": {"format": "json", "level": "warning", "access_log": False},
            "backends": [
                {
                    "id": "gpu",
                    "kind": "vllm",
                    "base_url": sim.url,
                    "models": [{"name": "m"}],
                    "region": "eu",
                    "owner": "t",
                }
            ],
            "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
            "admin": ADMIN,
            **extra,
        }
        gateway = GatewayProcess(config, tmp_path)
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        gateway.stop(signal.SIGKILL)


# A fixture that needs something outside the Python environment -> the marker of its group.
MARKED_FIXTURES = {
    "redis_server": "redis",
    "real_llamacpp": "real_backend",
    "real_smollm2_server": "real_backend",
}
# Fixtures that open sockets or start processes: integration tests only (tests/README.md).
INTEGRATION_FIXTURES = {
    "start_sim",
    "start_gateway",
    "sim_and_gateway",
    "start_raw",
    "process",
    *MARKED_FIXTURES,
}
UNIT = Path(__file__).parent / "unit"


def _imports_owngate_bench(module: ModuleType) -> bool:
    """Whether a test module holds a module, class or function of the benchmark
    distribution (`owngate_bench`, bench/), which the runtime tests must not need."""
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", "")
        if isinstance(name, str) and name.split(".")[0] == "owngate_bench":
            return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test using `redis_server`, `real_llamacpp` or `real_smollm2_server` carries its
    group's marker, so
    `-m "not <marker>"` deselects all of them (the marker's prerequisite may be absent);
    every test in a module that imports `owngate_bench` is a `bench` test; no unit test
    uses a fixture that opens a socket or starts a process."""
    bench_modules: dict[str, bool] = {}
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        module = getattr(item, "module", None)
        if isinstance(module, ModuleType) and not item.get_closest_marker("bench"):
            if module.__name__ not in bench_modules:
                bench_modules[module.__name__] = _imports_owngate_bench(module)
            if bench_modules[module.__name__]:
                raise pytest.UsageError(
                    f"{item.nodeid}: its module imports owngate_bench: mark it `bench`, "
                    "or use tests/helpers"
                )
        for fixture, marker in MARKED_FIXTURES.items():
            if fixture in fixtures and not item.get_closest_marker(marker):
                raise pytest.UsageError(f"{item.nodeid} uses `{fixture}`: mark it `{marker}`")
        if item.path.is_relative_to(UNIT) and fixtures & INTEGRATION_FIXTURES:
            used = ", ".join(sorted(fixtures & INTEGRATION_FIXTURES))
            raise pytest.UsageError(f"{item.nodeid} uses {used}: move it to tests/integration/")


_PREWARM = pytest.StashKey[subprocess.Popen[bytes] | None]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run that selected a `real_backend` test starts installing the real llama-server in
    the background now (tests/helpers/real_backend/prewarm.py), so a cold build overlaps
    the tests before the first one that needs it."""
    if session.config.option.collectonly:
        return
    if any(item.get_closest_marker("real_backend") for item in session.items):
        session.config.stash[_PREWARM] = prewarm.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop a background installation the run no longer waits for."""
    prewarm.stop(session.config.stash.get(_PREWARM, None))
