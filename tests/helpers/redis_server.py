"""A private `redis-server` for tests: its own free port, no persistence, stoppable and
restartable on the same port. The `redis_server` fixture (tests/conftest.py) starts one for
a test; tests that need one carry the `redis` marker (tests/helpers/prerequisites.py)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from gateway.state.redis_state import RedisState
from gateway.state.revocation_keeper import KeptRevocations
from tests.helpers.net import free_port

__all__ = ["LEASE_TTL_S", "SYNC_S", "RedisServer", "replica", "replicas"]

LEASE_TTL_S = 3.0  # a replica's lease on its in-flight counts, in these tests
SYNC_S = 0.05  # how often a replica syncs revocations and in-flight counts, in these tests


class RedisServer:
    """A throwaway redis-server on a free port; stop() and start() keep the port."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self.process is None
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def replica(
    server: RedisServer,
    name: str,
    lease_ttl_s: float = LEASE_TTL_S,
    timeout_s: float = 5.0,
    kept: KeptRevocations | None = None,
) -> RedisState:
    """A replica's shared state on `server` (key prefix `test`), keeping its revocations in
    `kept` (this host's list) when given. Generous timeouts, so a loaded test machine does
    not fall back where a test checks the shared path; the outage test sets the
    production-like one."""
    return RedisState(
        server.url,
        replica_id=name,
        key_prefix="test",
        timeout_s=timeout_s,
        sync_interval_s=SYNC_S,
        lease_ttl_s=lease_ttl_s,
        kept=kept,
    )


@asynccontextmanager
async def replicas(
    server: RedisServer, *names: str, timeout_s: float = 5.0
) -> AsyncIterator[list[RedisState]]:
    """Started replicas (`replica`), each healthy; closed on the way out."""
    states = [replica(server, name, timeout_s=timeout_s) for name in names]
    try:
        for state in states:
            await state.start()
            assert state.healthy, state.degraded_reason
        yield states
    finally:
        for state in states:
            await state.close()
