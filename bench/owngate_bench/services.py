"""Server processes the benchmarks start, wait for, measure and stop.

Each `Service` runs in its own session (process group) so that stopping it also ends the
workers it spawned, and logs to a file whose tail goes into error messages.
`tree_cpu_seconds` reads the CPU time of a process and its descendants from /proc, and
`machine_busy_seconds` that of the whole machine, to tell how much other work shared it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gateway
from gateway.routing.prometheus import parse_metrics

__all__ = [
    "HOST",
    "Service",
    "child_env",
    "env_flag",
    "free_port",
    "fresh_log_dir",
    "machine_busy_seconds",
    "owngate_argv",
    "tree_cpu_seconds",
]

HOST = "127.0.0.1"


def env_flag(name: str, default: str) -> str:
    """A benchmark flag's default: the environment's OWNGATE_BENCH_<name>, else `default`."""
    return os.environ.get(f"OWNGATE_BENCH_{name}", default)


def free_port() -> int:
    """A TCP port on HOST that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def child_env() -> dict[str, str]:
    """Our environment, with the `gateway` and `owngate_bench` packages we run importable
    by the processes we start (installed or not)."""
    env = dict(os.environ)
    roots = {str(Path(module).resolve().parents[1]) for module in (gateway.__file__, __file__)}
    paths = [*sorted(roots), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def fresh_log_dir(directory: Path) -> None:
    """Leave no provenance log at `directory` for the run about to start one there under
    a fresh key: remove the directory and, beside it, the high-water files of its log
    (`<dir>.high-water`, `-worker-<i>`), which would otherwise make the gateway refuse the
    new, empty log as a fork of the last run's."""
    if directory.exists():
        shutil.rmtree(directory)
    for high_water in directory.parent.glob(f"{glob.escape(directory.name)}.high-water*"):
        high_water.unlink(missing_ok=True)


def owngate_argv(*args: str) -> list[str]:
    """`owngate ARGS` with this interpreter, whether or not the console script is installed."""
    return [sys.executable, "-c", "from gateway.cli.main import entrypoint; entrypoint()", *args]


def tree_cpu_seconds(root: int) -> float:
    """User+system CPU seconds of `root` and all its live descendants, reaped children included.

    A child's time is in its own utime/stime while it lives and in its parent's
    cutime/cstime once reaped, so summing all four over the live tree counts each tick once.
    """
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_bytes()
        except OSError:  # the process exited while we scanned
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()  # the name may hold spaces and parens
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        ticks[pid] = sum(int(value) for value in fields[11:15])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all processes of this machine spent busy (not idle or waiting on I/O)."""
    with open("/proc/stat", "rb") as stat:
        fields = [int(value) for value in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class Service:
    """A server process the benchmark started, listening on HOST:port."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        logdir: Path,
        port: int,
        *,
        own_session: bool = True,
    ) -> Service:
        """Start `argv` in a process group of its own (stopped as a whole). With
        `own_session` (the default) also in a session of its own; without it, it stays in
        the benchmark's session, and so, where the kernel groups scheduling by session
        (autogroup), in the benchmark's scheduling group, beside its load generator."""
        log = logdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=own_session,
                process_group=None if own_session else 0,
            )
        return cls(name, proc, port, log)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-limit:]
        except OSError as exc:
            return f"(no log: {exc})"

    def readyz(self) -> dict[str, Any] | None:
        """An owngate's readiness detail, or None when it does not answer with it."""
        return readyz(self.port)

    def histogram(self, name: str) -> dict[float, float]:
        """Cumulative bucket counts {upper bound: count} of an unlabelled histogram on this
        owngate's `/metrics` (empty when it does not answer or has no such histogram)."""
        text = get_text(self.port, "/metrics")
        try:
            samples = parse_metrics(text) if text is not None else {}
        except ValueError:
            return {}
        return {float(s.labels["le"]): s.value for s in samples.get(f"{name}_bucket", [])}

    def wait_backend_available(self, backend: str, timeout: float) -> None:
        """Ready is not enough: the gateway must also have seen the simulator healthy, or
        the first requests of a load point measure 503s (a cold start of the simulator)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = (self.readyz() or {}).get("backends", {}).get(backend, {})
            if isinstance(state, dict) and state.get("available"):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: backend {backend} never became available")

    def wait_ready(self, path: str, headers: Mapping[str, str], timeout: float) -> None:
        """Poll GET `path` until it answers 200; raise RuntimeError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.log_tail()}")
            conn = http.client.HTTPConnection(HOST, self.port, timeout=2.0)
            try:
                conn.request("GET", path, headers=dict(headers))
                response = conn.getresponse()
                last = f"{response.status} {response.read()[:200]!r}"
                if response.status == 200:
                    return
            except OSError as exc:
                last = repr(exc)
            finally:
                conn.close()
            time.sleep(0.2)
        raise RuntimeError(
            f"{self.name} not ready after {timeout:.0f}s ({last}): {self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it if the leader is still there after `timeout`.

        The group is signalled even when its leader has exited: workers may outlive it.
        """
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout)


def get_text(port: int, path: str) -> str | None:
    """GET `path` from a local server on a new connection: its body, or None when it does
    not answer (any status is returned: the callers check what they read)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=5.0)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def readyz(port: int) -> dict[str, Any] | None:
    """An owngate's readiness detail (`readiness` of `/admin/status`: the benchmark's
    gateways set `admin.allow_loopback`) on a new connection, or None when it does not
    answer with it."""
    text = get_text(port, "/admin/status")
    try:
        report = json.loads(text) if text is not None else None
    except ValueError:
        return None
    detail = report.get("readiness") if isinstance(report, dict) else None
    return detail if isinstance(detail, dict) else None


def histogram_quantile(
    before: Mapping[float, float], after: Mapping[float, float], q: float
) -> float | None:
    """The `q` quantile of what a histogram observed between two reads of its cumulative
    buckets (`Service.histogram`), interpolated linearly inside the bucket it falls in,
    as Prometheus's histogram_quantile does; None when nothing was observed. A quantile
    in the +Inf bucket reads as the highest finite bound."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower
