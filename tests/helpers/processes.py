"""`owngate` servers as their own processes, as production runs them.

The signal handling, worker supervision, restart recovery and the real HTTP parser only
exist in a process: `GatewayProcess` writes a config to a directory, runs
`python -m gateway serve --config gateway.yaml` there, and waits for `/readyz`. Its
stdout and stderr go to files in that directory (a pipe nobody reads would fill and stall
a chatty gateway); `stdout()`, `stderr()`, `output()` and `written()` read them back.

`ServerProcess` runs any server command line (`owngate sim`, or `owngate serve` on a
config file the test wrote, several sharing one directory) in its own session, so that
`kill` ends it and whatever it spawned at once; `owngate_argv` is the `owngate` command
line both use.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.helpers.waiting import until

__all__ = ["KEY", "GatewayProcess", "ServerProcess", "listening_sockets", "owngate_argv"]

KEY = "og-process-test-key-0123456789"  # acme's key at the `process` fixture's gateways


def owngate_argv(*args: str) -> list[str]:
    """`owngate ARGS` run by this interpreter (`python -m gateway`), installed script or not."""
    return [sys.executable, "-m", "gateway", *args]


def refused_start(directory: Path, *args: str) -> str:
    """Run `owngate serve --config gateway.yaml *args` in `directory`, which must refuse
    to start (exit 1, within 30 s; a serve that starts fails the test): its stderr."""
    proc = subprocess.Popen(
        owngate_argv("serve", "--config", "gateway.yaml", *args),
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        raise AssertionError(f"owngate serve {' '.join(args)} started; it must refuse") from None
    assert proc.returncode == 1, (out, err)
    return err.decode()


def listening_sockets(port: int) -> int:
    """How many sockets listen on TCP `port` (IPv4, this network namespace): each worker
    of `serve --workers N` listens on a socket of its own (SO_REUSEPORT), the kernel
    spreads new connections over those listening, and `/readyz` answers as soon as one
    does. Wait for N before counting what the workers admitted in all."""
    listen = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == listen and int(fields[1].rsplit(":", 1)[1], 16) == port:
            count += 1
    return count


def _answers_200(
    url: str,
    proc: subprocess.Popen[bytes],
    name: str,
    output: Callable[[], str],
    verify: ssl.SSLContext | bool = True,
) -> bool:
    """Whether GET `url` answers 200 now (an https `url` over `verify`, httpx's TLS
    setting); fails the test at once when `proc` has exited."""
    if proc.poll() is not None:
        raise AssertionError(f"{name} exited {proc.returncode}: {output()}")
    try:
        return httpx.get(url, timeout=2, verify=verify).status_code == 200
    except httpx.TransportError:
        return False


def worker_pids(supervisor: int) -> list[int]:
    """The pids of `owngate serve --workers N`'s workers: the supervisor's children now."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return sorted(int(pid) for pid in children)


class GatewayProcess:
    """`owngate serve` in `directory`: its gateway.yaml, the paths the config names
    relative to it, stdout.log and stderr.log. `args` are more `owngate serve` flags,
    `env` more environment variables. `proc` is the running process (signal it directly)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        directory: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.directory = directory
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.port = int(config["listen"]["port"])
        self.path = directory / "gateway.yaml"
        directory.mkdir(parents=True, exist_ok=True)
        self.path.write_text(yaml.safe_dump(dict(config)))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> GatewayProcess:
        """Start it (again: the output files start over) and wait until it is ready."""
        with (
            (self.directory / "stdout.log").open("wb") as out,
            (self.directory / "stderr.log").open("wb") as err,
        ):
            self.proc = subprocess.Popen(
                owngate_argv("serve", "--config", self.path.name, *self.args),
                cwd=self.directory,
                stdout=out,
                stderr=err,
                env=self.env,
            )
        proc = self.proc
        until(
            lambda: _answers_200(f"{self.url}/readyz", proc, "gateway", self.output),
            f"gateway ready at {self.url}/readyz",
            timeout=timeout_s,
            interval=0.05,
            detail=self.output,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_bytes(self) -> int:
        """The gateway's resident set size now (VmRSS in /proc/<pid>/status)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")

    def wait(self, timeout_s: float = 60.0) -> int:
        """Its exit code, once it has exited (by itself or after a signal a test sent)."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 60.0) -> int:
        """Send `sig` (SIGINT: drain and a final checkpoint) and wait for the exit code;
        SIGKILL only if it hangs. 0 when it never started."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return self.proc.returncode

    def stdout(self) -> str:
        """Everything it wrote to stdout since it last started."""
        return self._read("stdout.log")

    def stderr(self) -> str:
        """Everything it wrote to stderr since it last started."""
        return self._read("stderr.log")

    def _read(self, name: str) -> str:
        path = self.directory / name
        return path.read_bytes().decode("utf-8", "replace") if path.is_file() else ""

    def output(self) -> str:
        """The tail of what it printed (for failure messages)."""
        files = [self.directory / "stdout.log", self.directory / "stderr.log"]
        text = b"".join(p.read_bytes() for p in files if p.is_file())
        return text.decode("utf-8", "replace")[-3000:]

    def written(self) -> list[bytes]:
        """Every byte it wrote: stdout, stderr, and each provenance log file under log/."""
        files = [self.directory / "stdout.log", self.directory / "stderr.log"]
        log = self.directory / "log"
        if log.is_dir():
            files += sorted(p for p in log.rglob("*") if p.is_file())
        return [p.read_bytes() for p in files if p.is_file()]


class ServerProcess:
    """A server the test starts by its command line `argv`, listening on 127.0.0.1:`port`.

    It runs in its own session (process group) with our environment, its stdout and
    stderr in `<directory>/<name>.log`; `proc` is the running process (signal it
    directly to end only the leader)."""

    def __init__(
        self, name: str, argv: Sequence[str], directory: Path, port: int, scheme: str = "http"
    ) -> None:
        self.name = name
        self.port = port
        self.scheme = scheme
        self.log = directory / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def wait_ready(
        self, path: str, timeout_s: float = 30.0, verify: ssl.SSLContext | bool = True
    ) -> ServerProcess:
        """Wait until GET `path` answers 200 (over https: with `verify`, httpx's TLS
        setting); fails the test if it exits first."""
        until(
            lambda: _answers_200(f"{self.url}{path}", self.proc, self.name, self.output, verify),
            f"{self.name} answering 200 at {path}",
            timeout=timeout_s,
            interval=0.05,
            detail=self.output,
        )
        return self

    def kill(self) -> None:
        """SIGKILL its whole session, no goodbye, and reap it. The group is signalled even
        when the leader has exited: what it spawned may outlive it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def output(self) -> str:
        """The tail of what it printed (for failure messages)."""
        text = self.log.read_bytes() if self.log.is_file() else b""
        return text.decode("utf-8", "replace")[-3000:]
