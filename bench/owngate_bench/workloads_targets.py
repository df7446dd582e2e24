"""What `owngate bench workloads` measures against: a backend, and owngate in front of it.

Backends: `llamacpp`, a real llama.cpp `llama-server` serving SmolLM2-135M-Instruct
(F16, probed to answer correctly; installed by tests/helpers/real_backend/setup.sh
--with-smollm2, whose stdlib helper `server.py` this module loads from the repository),
or `sim-gh200`, owngate's simulator configured as a GH200-class vLLM server
(`GH200_SIM`, served in this process by `SimHost`).

Targets: `direct` (the backend itself), `owngate` (plain: one backend, the built-in
policy set, no log) and `owngate+production` (the overhead benchmark's configured
trust-policy set, `owngate_bench.overhead_policy`, over the backend plus an excluded
second private backend and a hosted fallback, with the signed provenance log on:
fsync'd group commit, receipts, checkpoints). Each gateway is one worker, `owngate
serve`, its own process group, CPU read from /proc.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import gateway
from gateway.sim import SimSettings
from owngate_bench.overhead_policy import HOSTED_KEY_ENV, write_policy_config
from owngate_bench.services import (
    HOST,
    Service,
    child_env,
    free_port,
    fresh_log_dir,
    owngate_argv,
)

__all__ = [
    "BACKENDS",
    "GH200_SIM",
    "MODEL",
    "TARGETS",
    "Backend",
    "backend",
    "gateway_config",
    "gateways",
    "real_backend_helper",
]

MODEL = "smollm2"
BACKENDS = ("llamacpp", "sim-gh200")
TARGETS = ("direct", "owngate", "owngate+production")
ORIGIN = "bench.owngate/workloads"

# A GH200-class vLLM server for a mid-size model: 256 sequences at once, fast prefill,
# ~100 tokens/s per sequence alone and ~75 at a full batch (~19,000 tokens/s over 256
# sequences, the order of the seeds' ~23,000), a large KV cache, a 32k context.
GH200_SIM = SimSettings(
    kind="vllm",
    models=(MODEL,),
    slots=256,
    prefill_tokens_per_s=40_000.0,
    decode_tokens_per_s=100.0,
    batch_slowdown=0.0013,
    kv_capacity_tokens=2_000_000,
    n_ctx=32768,
    seed=1,
)


@dataclasses.dataclass(frozen=True)
class Backend:
    """One running backend: its kind for owngate's config, where it listens, what it is."""

    kind: str  # owngate backend kind: llamacpp, vllm
    port: int
    describe: dict[str, Any]
    tokenizer: Path | None = None  # directory with the served model's tokenizer.json

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


def real_backend_helper() -> ModuleType:
    """tests/helpers/real_backend/server.py of the repository this gateway runs from
    (stdlib only, written to be shared by tests, scripts and benchmarks)."""
    path = Path(gateway.__file__).resolve().parents[1] / "tests/helpers/real_backend/server.py"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: run from a checkout of the repository")
    spec = importlib.util.spec_from_file_location("owngate_real_backend_server", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def backend(
    name: str, rundir: Path, *, slots: int = 4, ctx_size: int = 8192, tiny: bool = False
) -> Iterator[Backend]:
    """Start backend `name` (see BACKENDS); `tiny`: llama.cpp's random-weight tiny model
    instead of SmolLM2 (CI's smoke run)."""
    if name == "sim-gh200":
        from owngate_bench.simhost import SimHost

        with SimHost([("gh200", GH200_SIM)], HOST) as host:
            described = {k: v for k, v in dataclasses.asdict(GH200_SIM).items() if k != "faults"}
            yield Backend("vllm", host.ports["gh200"], {"backend": name, **described})
        return
    helper = real_backend_helper()
    installation = helper.install(with_smollm2=not tiny)
    model = installation.tiny_model if tiny else installation.smollm2_model
    with helper.running_llama_server(
        installation,
        model=model,
        alias=MODEL,
        slots=slots,
        ctx_size=ctx_size,
        threads=1,
        log_dir=rundir,
    ) as server:
        yield Backend(
            "llamacpp",
            server.port,
            {
                "backend": name,
                "binary": str(installation.server_binary.resolve()),
                "model": str(model),
                "slots": slots,
                "ctx_size": ctx_size,
                "threads": 1,
                "pid": server.pid,
            },
            installation.tiny_tokenizer_dir if tiny else installation.smollm2_tokenizer_dir,
        )


def key_hash(api_key: str) -> str:
    return "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()


def gateway_config(
    rundir: Path, target: str, backends: list[Backend], port: int, api_key: str, strategy: str
) -> tuple[Path, dict[str, str]]:
    """Write target's gateway.yaml (and policies/ and signing key for production); return
    its path and the environment variables it needs."""
    routing = f"routing: {{default: {{strategy: {strategy}}}}}\n"
    if target == "owngate+production":
        first = backends[0]
        config = write_policy_config(
            rundir,
            host=HOST,
            port=port,
            sim_port=first.port,
            closed_port=free_port(),
            model=MODEL,
            key_hash=key_hash(api_key),
        )
        from gateway.provenance import write_signing_key  # the auditor's package, light

        key_file = rundir / "log.key"
        key_file.unlink(missing_ok=True)
        write_signing_key(key_file, ORIGIN)
        logdir = rundir / f"provenance-log-{port}"
        fresh_log_dir(logdir)  # a port an earlier run's gateway had: its log is not ours
        text = config.read_text().replace("kind: vllm", f"kind: {first.kind}")
        text += (
            routing + f"provenance: {{dir: '{logdir}', origin: {ORIGIN}, "
            f"signing_key_file: '{key_file}', group_commit_ms: 2}}\n"
        )
        config.write_text(text)
        return config, {HOSTED_KEY_ENV: "sk-bench-hosted-" + secrets.token_hex(8)}
    lines = [
        f"listen: {{host: {HOST}, port: {port}}}",
        "logging: {format: json, level: warning}",
        routing.rstrip("\n"),
        "backends:",
    ]
    for index, found in enumerate(backends):
        lines.append(
            f"  - {{id: b{index}, kind: {found.kind}, base_url: '{found.url}', "
            f"models: [{{name: {MODEL}}}], region: local, owner: bench}}"
        )
    lines += [
        "tenants:",
        f"  - {{id: bench, api_key_hashes: ['{key_hash(api_key)}'], models: ['*']}}",
        "admin: {allow_loopback: true, listen: null}",
    ]
    config = rundir / f"{target.replace('+', '-')}-{strategy}-{port}.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config, {}


@contextlib.contextmanager
def gateways(
    rundir: Path,
    targets: tuple[str, ...],
    backends: list[Backend],
    api_key: str,
    strategy: str = "score",
) -> Iterator[dict[str, Service]]:
    """Start one `owngate serve` per gateway target in `targets` in front of `backends`,
    wait until each has seen its first backend healthy; stop them all on the way out."""
    env = child_env()
    started: dict[str, Service] = {}
    try:
        for target in targets:
            if target == "direct":
                continue
            port = free_port()
            config, extra_env = gateway_config(rundir, target, backends, port, api_key, strategy)
            argv = owngate_argv("serve", "--config", str(config))
            name = f"{target}-{strategy}"
            started[target] = Service.start(name, argv, {**env, **extra_env}, rundir, port)
        auth = {"Authorization": f"Bearer {api_key}"}
        for target, service in started.items():
            service.wait_ready("/v1/models", auth, 60.0)
            service.wait_backend_available("sim" if target == "owngate+production" else "b0", 60.0)
        yield started
    finally:
        for service in started.values():
            service.stop()
