"""The gateway as its own process: SIGHUP policy reload, and a SIGKILL under load.

These run `owngate serve` in a subprocess (the signal handling and restart recovery
only exist there) against simulators in this process.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.provenance import (
    LogDirectory,
    load_verifiers,
    verify_log,
    verify_receipt,
    write_signing_key,
)
from gateway.serving import bind_socket
from gateway.tenants import hash_api_key
from tests.conftest import ADMIN, Sim, readiness

KEY = "og-process-test-key-0123456789"
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: p, version: "{version}"}}
spec:
  tenants: [acme]
  residency: {{allow: ["*"]}}
  retention: {{max_days: any}}
  fallback: {{mode: never}}
"""


def free_port() -> int:
    sock = bind_socket("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    sock.close()
    return port


class GatewayProcess:
    def __init__(self, config: dict[str, Any], directory: Path, *args: str) -> None:
        self.args = args  # more `owngate serve` flags
        self.port = config["listen"]["port"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.path = directory / "gateway.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GatewayProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(self.path), *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None, self.proc.communicate()[1].decode()[-3000:]
            time.sleep(0.05)
        raise AssertionError("gateway did not become ready")

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.communicate(timeout=30)


@pytest.fixture
def process(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[Callable[..., GatewayProcess]]:
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


def test_sighup_reloads_policies(process: Callable[..., GatewayProcess], tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(POLICY.format(version="1"))
    gateway = process(policy={"paths": ["policies"], "reload_interval_s": 3600}).start()
    before = readiness(gateway.url)["policy"]
    (policies / "p.yaml").write_text(POLICY.format(version="2"))
    assert gateway.proc is not None
    gateway.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    after = before
    while after["digest"] == before["digest"] and time.monotonic() < deadline:
        time.sleep(0.05)
        after = readiness(gateway.url)["policy"]
    assert after["digest"] != before["digest"]  # the file poll (an hour) did not do this


def test_sigkill_under_load_loses_no_dispatch_record(
    process: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    vkey = write_signing_key(tmp_path / "log.key", "test.owngate/crash")
    gateway = process(
        provenance={"dir": "log", "origin": "test.owngate/crash", "signing_key_file": "log.key"}
    ).start()
    receipts: list[bytes] = []
    stop = threading.Event()

    def load() -> None:
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
        with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}) as c:
            for _ in range(2000):  # bounded; the kill ends it sooner
                if stop.is_set():
                    return
                try:
                    response = c.post("/v1/chat/completions", json=body, timeout=5)
                except httpx.TransportError:
                    return
                if response.status_code == 200:
                    receipts.append(base64.b64decode(response.headers["x-owngate-receipt"]))

    streamed: list[str] = []  # request ids of streams that received bytes

    def stream() -> None:  # long answers read slowly: the kill cuts them mid-stream
        ask = [{"role": "user", "content": "x"}]
        body = {"model": "m", "max_tokens": 4000, "stream": True, "messages": ask}
        with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}) as c:
            for _ in range(200):  # bounded; the kill ends it sooner
                if stop.is_set():
                    return
                try:
                    with c.stream("POST", "/v1/chat/completions", json=body, timeout=5) as r:
                        if r.status_code != 200:
                            continue
                        for _chunk in r.iter_bytes():
                            if r.headers["x-request-id"] not in streamed:
                                streamed.append(r.headers["x-request-id"])
                            time.sleep(0.005)
                except httpx.TransportError:
                    return

    threads = [threading.Thread(target=load) for _ in range(4)]
    threads.append(threading.Thread(target=stream))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(receipts) < 50 and time.monotonic() < deadline:
        time.sleep(0.02)
    gateway.stop(signal.SIGKILL)  # no final checkpoint, possibly a torn tail
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    assert len(receipts) >= 50

    gateway.start()  # recovers the log: cuts a torn tail, continues the chain
    gateway.stop(signal.SIGINT)  # and signs a final checkpoint
    verifiers = load_verifiers([vkey])
    summary = verify_log(tmp_path / "log", verifiers)
    logged = {
        record.request_id: index
        for index, record in LogDirectory(tmp_path / "log").records(summary.size)
        if record.type == "dispatch"
    }
    # Every client that got an answer holds a receipt for a durable dispatch record...
    for envelope in receipts:
        receipt = verify_receipt(envelope, verifiers)
        assert logged.get(receipt.request_id) == receipt.index
    # ... and so does every stream the kill cut short, once it had received bytes.
    assert streamed
    assert all(request_id in logged for request_id in streamed)
    assert os.listdir(tmp_path / "log")
