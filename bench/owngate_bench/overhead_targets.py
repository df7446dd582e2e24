"""The overhead benchmark's targets: the servers it starts side by side, and how to reach them.

Simulators: one zero-latency simulator serving `MODEL` (coalesced streams) and, when a
paced point runs, one serving `PACED_MODEL` with `--token-interval` (paced streams);
`owngate+production` gets a second of each (score routing over two backends). Targets:

- `direct`: the simulators themselves;
- `nginx`: a bare reverse proxy, one worker (`overhead_nginx`), one port per simulator;
- `owngate`: plain (built-in policy set, no provenance log, access line not written);
- `owngate+policy`: a generated trust-policy set (`overhead_policy`);
- `owngate+tracing`: plain with OpenTelemetry on, exporting to a loopback sink;
- `owngate+accesslog`: plain with its JSON access line written (`level: info`) to a file;
- `owngate+production`: policy set, provenance log, score routing over two backends and
  the access log (`overhead_production`);
- `litellm`: LiteLLM's proxy, one worker, in front of the coalesced simulator only.

Each owngate serves both models on one port; a point picks its model by shape.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from owngate_bench import litellm_proxy
from owngate_bench.overhead_nginx import (
    NGINX_MISSING,
    nginx_argv,
    nginx_binary,
    write_nginx_config,
)
from owngate_bench.overhead_points import PACE_S, PACED_MODEL, Point
from owngate_bench.overhead_policy import HOSTED_KEY_ENV, write_policy_config
from owngate_bench.overhead_production import PRODUCTION, backend_ids, write_production_config
from owngate_bench.overhead_tracing import TRACED, TraceSink
from owngate_bench.services import HOST, Service, child_env, free_port, owngate_argv

__all__ = [
    "ACCESS_LOGGED",
    "MODEL",
    "OWNGATES",
    "TARGETS",
    "Sims",
    "Target",
    "key_hash",
    "started",
]

MODEL = "bench-model"
ACCESS_LOGGED = "owngate+accesslog"
"""Plain owngate's config with its JSON access log written (`level: info`)."""
TARGETS = (
    "direct",
    "nginx",
    "owngate",
    "owngate+policy",
    TRACED,
    ACCESS_LOGGED,
    PRODUCTION,
    "litellm",
)
OWNGATES = ("owngate", "owngate+policy", TRACED, ACCESS_LOGGED, PRODUCTION)


def key_hash(api_key: str) -> str:
    return "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()


@dataclasses.dataclass
class Sims:
    """The simulators of the run, per shape: the first of each list is everyone's."""

    coalesced: list[Service] = dataclasses.field(default_factory=list)
    paced: list[Service] = dataclasses.field(default_factory=list)

    def of(self, point: Point) -> list[Service]:
        return self.paced if point.paced else self.coalesced

    def models(self, count: int) -> dict[str, list[int]]:
        """model -> the ports of its first `count` simulators."""
        found = {MODEL: [s.port for s in self.coalesced[:count]]}
        if self.paced:
            found[PACED_MODEL] = [s.port for s in self.paced[:count]]
        return found


@dataclasses.dataclass
class Target:
    """A target of the run: its server (a simulator for `direct`) or why it is missing."""

    name: str
    service: Service | None = None
    error: str | None = None
    config: Path | None = None  # owngate's generated gateway.yaml
    policy: dict[str, Any] | None = None  # the policy set owngate says it enforces
    ports: dict[str, int] = dataclasses.field(default_factory=dict)  # shape -> port
    behind: dict[str, list[Service]] = dataclasses.field(default_factory=dict)  # shape -> sims
    backends: list[str] = dataclasses.field(default_factory=list)  # owngate's private ids

    def runs(self, point: Point) -> bool:
        """Whether this target takes part in `point` (LiteLLM: the base points only)."""
        if self.service is None:
            return False
        shape = "paced" if point.paced else "coalesced"
        if shape not in self.ports:
            return False
        return self.name != "litellm" or (not point.paced and not point.prompt_bytes)

    def port(self, point: Point) -> int:
        return self.ports["paced" if point.paced else "coalesced"]

    def cpu_pids(self, point: Point) -> dict[str, int]:
        """The process trees whose CPU a window reads: the target, then its simulators."""
        assert self.service is not None
        behind = self.behind.get("paced" if point.paced else "coalesced", [])
        if self.name == "direct":  # the simulator is the target
            return {"target": behind[0].proc.pid}
        pids = {"target": self.service.proc.pid}
        for index, sim in enumerate(behind):
            pids["sim" if index == 0 else f"sim{index + 1}"] = sim.proc.pid
        return pids

    def describe(self) -> dict[str, Any]:
        if self.service is None:
            return {"error": self.error}
        found: dict[str, Any] = {"url": self.service.url, "pid": self.service.proc.pid}
        found["ports"] = dict(self.ports)
        if self.config is not None:
            found["config"] = str(self.config)
        if self.policy is not None:
            found["policy"] = self.policy
        return found


def _plain_config(sims: Sims, port: int, api_key: str, level: str = "warning") -> str:
    """Plain owngate; at `level: warning` its access lines (info) are not written."""
    lines = [
        f"listen: {{host: {HOST}, port: {port}}}",
        f"logging: {{format: json, level: {level}}}",
        "backends:",
    ]
    for model, ports in sims.models(1).items():
        ident = "sim" if model == MODEL else f"sim-{model}"
        lines += [
            f"  - {{id: {ident}, kind: vllm, base_url: 'http://{HOST}:{ports[0]}',",
            f"     models: [{{name: {model}}}], region: local, owner: bench}}",
        ]
    lines += [
        "tenants:",
        f"  - {{id: bench, api_key_hashes: ['{key_hash(api_key)}'], models: ['*']}}",
        "admin: {allow_loopback: true, listen: null}",  # reads /admin/status; no admin API
    ]
    return "\n".join(lines) + "\n"


def _private_ids(sims: Sims) -> list[str]:
    return ["sim", *(f"sim-{m}" for m in sims.models(1) if m != MODEL)]


def _start_sims(sims: Sims, env: dict[str, str], rundir: Path, count: int, paced: bool) -> None:
    for shape, model, extra in (
        ("coalesced", MODEL, []),
        ("paced", PACED_MODEL, ["--token-interval", str(PACE_S)]),
    ):
        if shape == "paced" and not paced:
            continue
        for index in range(count):
            port = free_port()
            argv = ["sim", "--kind", "vllm", "--zero-latency", "--host", HOST, "--port"]
            argv += [str(port), "--model", model, "--seed", str(1 + index), *extra]
            argv += ["--n-ctx", "65536"]  # the 100 KB prompts are ~25,600 tokens
            name = f"sim-{shape}" + ("" if index == 0 else f"-{index + 1}")
            getattr(sims, shape).append(Service.start(name, owngate_argv(*argv), env, rundir, port))


def _start_owngate(
    target: Target, sims: Sims, rundir: Path, api_key: str, env: dict[str, str], sink: TraceSink
) -> None:
    """Write the target's config and start it (not yet ready)."""
    port = free_port()
    gateway_env = env
    target.backends = _private_ids(sims)
    if target.name in ("owngate", TRACED, ACCESS_LOGGED):
        config = rundir / f"{target.name.replace('+', '-')}.yaml"
        level = "info" if target.name == ACCESS_LOGGED else "warning"
        config.write_text(_plain_config(sims, port, api_key, level))
        if target.name == TRACED:
            gateway_env = {**env, **sink.environment()}
    else:  # the hosted fallback needs its key set, though it is never called
        gateway_env = {**env, HOSTED_KEY_ENV: "sk-bench-hosted-" + secrets.token_hex(8)}
        if target.name == PRODUCTION:
            models = sims.models(2)
            config = write_production_config(
                rundir, host=HOST, port=port, sims=models, key_hash=key_hash(api_key)
            )
            target.backends = backend_ids(models)
        else:
            more = {m: p[0] for m, p in sims.models(1).items() if m != MODEL}
            config = write_policy_config(
                rundir,
                host=HOST,
                port=port,
                sim_port=sims.coalesced[0].port,
                closed_port=free_port(),
                model=MODEL,
                key_hash=key_hash(api_key),
                more=more,
            )
    target.config = config
    argv = owngate_argv("serve", "--config", str(config))
    target.service = Service.start(target.name, argv, gateway_env, rundir, port)
    target.ports = {"coalesced": port, **({"paced": port} if sims.paced else {})}
    count = 2 if target.name == PRODUCTION else 1
    target.behind = {"coalesced": sims.coalesced[:count], "paced": sims.paced[:count]}


def _start_nginx(target: Target, sims: Sims, rundir: Path, env: dict[str, str]) -> None:
    binary = nginx_binary()
    if binary is None:
        target.error = NGINX_MISSING
        return
    routes = {free_port(): sims.coalesced[0].port}
    target.ports["coalesced"] = next(iter(routes))
    if sims.paced:
        paced_port = free_port()
        routes[paced_port] = sims.paced[0].port
        target.ports["paced"] = paced_port
    config = write_nginx_config(rundir, HOST, routes)
    target.config = None  # not an owngate config: no policy to read
    port = target.ports["coalesced"]
    target.service = Service.start("nginx", nginx_argv(binary, config), env, rundir, port)
    target.behind = {"coalesced": sims.coalesced[:1], "paced": sims.paced[:1]}


@contextlib.contextmanager
def started(
    names: tuple[str, ...],
    paced: bool,
    litellm: tuple[Path, str],
    rundir: Path,
    api_key: str,
    log: Callable[[str], None],
    sink: TraceSink,
) -> Iterator[list[Target]]:
    """Start the simulators and `names` side by side; stop them all on the way out.
    `paced`: start the paced simulators too. `litellm`: its virtualenv and version.
    Only owngate+tracing traces (to `sink`): OTEL_* variables of ours are not passed on."""
    targets = [Target(name) for name in names]
    litellm_exe: Path | None = None
    if "litellm" in names:  # install first: the servers would only idle meanwhile
        try:
            litellm_exe = litellm_proxy.ensure_venv(*litellm, log)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            next(t for t in targets if t.name == "litellm").error = f"no LiteLLM: {exc}"
    env = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    sims = Sims()
    services: list[Service] = []
    try:
        _start_sims(sims, env, rundir, 2 if PRODUCTION in names else 1, paced)
        services += [*sims.coalesced, *sims.paced]
        ready: dict[str, tuple[str, dict[str, str], float]] = {
            s.name: ("/v1/models", {}, 30.0) for s in services
        }
        auth = {"Authorization": f"Bearer {api_key}"}
        for target in targets:
            if target.name == "direct":
                target.service = sims.coalesced[0]
                target.ports = {"coalesced": sims.coalesced[0].port}
                if sims.paced:
                    target.ports["paced"] = sims.paced[0].port
                target.behind = {"coalesced": sims.coalesced[:1], "paced": sims.paced[:1]}
            elif target.name == "nginx":
                _start_nginx(target, sims, rundir, env)
                ready["nginx"] = ("/v1/models", {}, 30.0)
            elif target.name in OWNGATES:
                _start_owngate(target, sims, rundir, api_key, env, sink)
                ready[target.name] = ("/v1/models", auth, 30.0)
            elif litellm_exe is not None:
                sim = sims.coalesced[0]
                proxy = litellm_proxy.LiteLLMProxy(
                    litellm_exe, rundir, sim.url, MODEL, api_key, HOST, free_port()
                )
                argv, proxy_env = proxy.command(), proxy.environment(env)
                target.service = Service.start("litellm", argv, proxy_env, rundir, proxy.port)
                target.ports = {"coalesced": proxy.port}
                target.behind = {"coalesced": [sim]}
                ready["litellm"] = (proxy.ready_path, {}, 120.0)  # its import alone takes ~8 s
            if target.service is not None and target.name != "direct":
                services.append(target.service)
        _wait_ready(services, targets, ready, sims)
        yield targets
    finally:
        for service in reversed(services):
            service.stop()


def _wait_ready(
    services: list[Service],
    targets: list[Target],
    ready: dict[str, tuple[str, dict[str, str], float]],
    sims: Sims,
) -> None:
    """Wait for every server; a target that never answers is marked failed (a simulator
    that never does fails the run). Owngates must also see their backends healthy."""
    own = {id(s) for s in [*sims.coalesced, *sims.paced]}
    for service in services:
        path, headers, timeout = ready[service.name]
        try:
            service.wait_ready(path, headers, timeout)
        except RuntimeError as exc:
            if id(service) in own:
                raise RuntimeError(f"the simulator did not start: {exc}") from exc
            for target in targets:
                if target.service is service:
                    target.service, target.error = None, str(exc)
    for target in targets:
        if target.config is not None and target.service is not None:
            for backend in target.backends:
                target.service.wait_backend_available(backend, 30.0)
            target.policy = _server_policy(target.service)


def _server_policy(service: Service) -> dict[str, Any] | None:
    """The policy set a running owngate reports in its readiness detail (id, version,
    digest, builtin)."""
    detail = service.readyz()
    policy = detail.get("policy") if detail is not None else None
    if not isinstance(policy, dict):
        return None
    return {k: policy[k] for k in ("id", "version", "digest", "builtin") if k in policy}
