"""`owngate serve` as its own process, as production runs it.

The signal handling, worker supervision, restart recovery and the real HTTP parser only
exist in a process: `GatewayProcess` writes a config to a directory, runs
`python -m gateway serve --config gateway.yaml` there, and waits for `/readyz`. Its
stdout and stderr go to files in that directory (a pipe nobody reads would fill and stall
a chatty gateway); `stdout()`, `stderr()`, `output()` and `written()` read them back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

__all__ = ["KEY", "GatewayProcess"]

KEY = "og-process-test-key-0123456789"  # acme's key at the `process` fixture's gateways


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

    def start(self, timeout_s: float = 60.0) -> GatewayProcess:
        """Start it (again: the output files start over) and wait until it is ready."""
        with (
            (self.directory / "stdout.log").open("wb") as out,
            (self.directory / "stderr.log").open("wb") as err,
        ):
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", self.path.name, *self.args],
                cwd=self.directory,
                stdout=out,
                stderr=err,
                env=self.env,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"gateway exited {self.proc.returncode}: {self.output()}")
            time.sleep(0.05)  # polling a condition (readiness), bounded by the deadline
        raise AssertionError(f"gateway not ready in {timeout_s}s: {self.output()}")

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
