"""The servers of `owngate bench seed-load`: paced simulators and the targets in front.

- two paced simulators (`owngate sim --zero-latency --token-interval S`): `sim` behind
  every target, `sim-b` the production configuration's second backend;
- `direct`: the simulator itself;
- `nginx`: one nginx worker as a bare reverse proxy to `sim`, as `bench overhead`'s
  (`owngate_bench.overhead_nginx`); skipped with a reason when nginx is not installed;
- `owngate`: plain (the built-in policy set, no provenance log, no access log), as
  `bench overhead`'s `owngate`;
- `owngate+production`: `bench overhead`'s production configuration
  (`owngate_bench.overhead_production`), one worker: the generated policy set (EU, zero
  retention, a hosted EU fallback never used), the provenance log on (receipts, fsync
  group commit, checkpoints), score routing over two private backends (`sim` and `sim-b`,
  `capacity.max_concurrency` declared) and the JSON access log on, as operators run it
  (written to the server's log file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from owngate_bench.overhead_nginx import NGINX_MISSING, nginx_argv, nginx_binary, write_nginx_config
from owngate_bench.overhead_policy import HOSTED_KEY_ENV
from owngate_bench.overhead_production import PRODUCTION, backend_ids, write_production_config
from owngate_bench.services import HOST, Service, child_env, free_port, owngate_argv

__all__ = ["MODEL", "NGINX_MISSING", "PRODUCTION", "TARGETS", "Target", "started"]

MODEL = "bench-model"
TARGETS = ("direct", "nginx", "owngate", PRODUCTION)
HOST_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it (little-endian)


@dataclasses.dataclass
class Target:
    """One target of the run: its server (the simulator itself for `direct`) or why not."""

    name: str
    service: Service | None = None
    error: str | None = None
    config: Path | None = None

    def describe(self) -> dict[str, Any]:
        if self.service is None:
            return {"skipped": self.error}
        found: dict[str, Any] = {"url": self.service.url, "pid": self.service.proc.pid}
        if self.config is not None:
            found["config"] = str(self.config)
        return found


def _key_hash(api_key: str) -> str:
    return "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()


def _plain_config(sim_port: int, port: int, api_key: str) -> str:
    return (
        f"listen: {{host: {HOST}, port: {port}}}\n"
        "logging: {format: json, level: warning, access_log: false}\n"
        # ~460 streams open at once on its one backend (default: 256 connections, then 503)
        "limits: {max_connections_per_backend: 1024}\n"
        "backends:\n"
        f"  - {{id: sim, kind: vllm, base_url: 'http://{HOST}:{sim_port}',\n"
        f"     models: [{{name: {MODEL}}}], region: local, owner: bench}}\n"
        "tenants:\n"
        f"  - {{id: bench, api_key_hashes: ['{_key_hash(api_key)}'], models: ['*']}}\n"
        "admin: {allow_loopback: true, listen: null}\n"  # reads /admin/status; no admin API
    )


def _listening_inodes(port: int) -> set[str]:
    """Inodes of the sockets listening on HOST:`port` (from /proc/net/tcp)."""
    wanted = f"{HOST_HEX}:{port:04X}"
    found = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == wanted and fields[3] == "0A":  # 0A: LISTEN
                found.add(fields[9])
    return found


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = (entry / "stat").read_bytes()
                children.setdefault(int(raw[raw.rindex(b")") + 2 :].split()[1]), []).append(
                    int(entry.name)
                )
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    return pids


def owns_port(service: Service) -> bool:
    """Whether the service's process tree holds the socket listening on its port: on a
    busy machine another program may take a port between `free_port` and our bind, and
    then answer our readiness check in our server's place."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(service.port)}
    for pid in _tree(service.proc.pid) if inodes else ():
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return True
    return False


def _check_owners(services: Sequence[Service], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    for service in services:
        while not owns_port(service):
            if service.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{service.name} does not hold port {service.port} (taken by another "
                    f"program?): {service.log_tail(300)}"
                )
            time.sleep(0.1)


def _pair(sims: Sequence[Service]) -> dict[str, list[int]]:
    """The production configuration's two backends of MODEL: both paced simulators."""
    return {MODEL: [sims[0].port, sims[1].port]}


def _start_sim(name: str, interval_s: float, rundir: Path, env: dict[str, str]) -> Service:
    port = free_port()
    argv = ["sim", "--kind", "vllm", "--zero-latency", "--token-interval", f"{interval_s:g}"]
    argv += ["--host", HOST, "--port", str(port), "--model", MODEL, "--seed", "1"]
    return Service.start(name, owngate_argv(*argv), env, rundir, port)


@contextlib.contextmanager
def started(
    names: Sequence[str], interval_s: float, rundir: Path, api_key: str, log: Callable[[str], None]
) -> Iterator[tuple[list[Service], list[Target]]]:
    """Start the simulators and the targets named; yield (simulators, targets); stop all."""
    env = child_env()
    targets = [Target(name) for name in names]
    services: list[Service] = []
    try:
        sims = [_start_sim("sim", interval_s, rundir, env)]
        services.append(sims[0])
        if PRODUCTION in names:
            sims.append(_start_sim("sim-b", interval_s, rundir, env))
            services.append(sims[1])
        auth = {"Authorization": f"Bearer {api_key}"}
        ready: dict[str, tuple[str, dict[str, str]]] = {s.name: ("/v1/models", {}) for s in sims}
        for target in targets:
            port = free_port()
            if target.name == "direct":
                target.service = sims[0]
                continue
            if target.name == "nginx":
                exe = nginx_binary()
                if exe is None:
                    target.error = NGINX_MISSING
                    log(f"  {NGINX_MISSING}")
                    continue
                conf = write_nginx_config(rundir, HOST, {port: sims[0].port})
                target.service = Service.start("nginx", nginx_argv(exe, conf), env, rundir, port)
                target.config = conf
                ready["nginx"] = ("/v1/models", {})
            else:
                gateway_env = env
                if target.name == PRODUCTION:
                    config = write_production_config(
                        rundir, host=HOST, port=port, sims=_pair(sims), key_hash=_key_hash(api_key)
                    )
                    gateway_env = {**env, HOSTED_KEY_ENV: "sk-bench-hosted-" + secrets.token_hex(8)}
                else:
                    config = rundir / "owngate.yaml"
                    config.write_text(_plain_config(sims[0].port, port, api_key))
                argv = owngate_argv("serve", "--config", str(config))
                target.service = Service.start(target.name, argv, gateway_env, rundir, port)
                target.config = config
                ready[target.name] = ("/v1/models", auth)
            services.append(target.service)
        for service in services:
            path, headers = ready[service.name]
            try:
                service.wait_ready(path, headers, 30.0)
            except RuntimeError as exc:
                if service in sims:
                    raise RuntimeError(f"the simulator did not start: {exc}") from exc
                for target in targets:
                    if target.service is service:
                        target.service, target.error = None, str(exc)[-1000:]
        _check_owners([s for s in services if s in sims or any(t.service is s for t in targets)])
        for target in targets:
            if target.service is not None and target.name.startswith("owngate"):
                production = target.name == PRODUCTION
                for backend in backend_ids(_pair(sims)) if production else ["sim"]:
                    target.service.wait_backend_available(backend, 30.0)
        yield sims, targets
    finally:
        for service in reversed(services):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                service.stop()
