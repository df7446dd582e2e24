"""A full or failing disk around the provenance log (issue 12, item 14).

- A completion whose write the disk refused is written once the disk takes writes again.
- A final checkpoint that cannot be signed at shutdown is reported (`shutdown_error`, a
  log line, exit 4 of `owngate serve`), and shared state still closes.
- `owngate serve` on a disk that refuses the log exits 4 at shutdown, 3 when restarted,
  and once the disk is back it recovers every entry and exits 0.
- `owngate serve` whose disk fills up while it serves, its own stderr on that disk too:
  streams and whole answers are refused (503 `provenance_unavailable`), `/readyz` and
  `owngate_provenance_ready` say so, none hangs, and it serves again once the disk is back,
  every receipt it handed out verifying against the log.

The disk fails as in tests/unit/test_provenance_log.py: the write-ahead segment's writes fail
(EIO) while a flag is set, or writing checkpoint files fails (ENOSPC), or a file stands
where the log needs a directory, or a separate process's file size limit (RLIMIT_FSIZE)
is lowered to 0 while it runs (every write to a regular file fails with EFBIG; Python
ignores SIGXFSZ), which stops root too, where a chmod would not.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import gateway.provenance.writer.segment_writer
import gateway.provenance.writer.store
from gateway.api import GatewayApp
from gateway.app import create_app
from gateway.provenance import (
    LogDirectory,
    ProvenanceLog,
    load_signer,
    verify_log,
    write_signing_key,
)
from gateway.serving import ServerThread
from gateway.sim import Faults
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.provenance import FailingDisk, run_audit
from tests.helpers.stream_receipts import stream_receipt
from tests.helpers.waiting import until

ORIGIN = "test.owngate/log/full-disk"
ASK = orjson.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})


@pytest.fixture
def logged(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[Callable[..., tuple[GatewayApp, ServerThread]]]:
    started: list[ServerThread] = []

    def start(faults: Faults | None = None, **provenance: Any) -> tuple[GatewayApp, ServerThread]:
        write_signing_key(tmp_path / "log.key", ORIGIN)
        sim = start_sim("vllm", models=("m",), zero_latency=True, faults=faults or Faults())
        config = gateway_config(
            [backend("gpu", sim.url, "m")],
            provenance={"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"} | provenance,
            limits={"first_byte_timeout_s": 60.0},
        )
        app = create_app(config, environ={}, config_dir=tmp_path)
        server = ServerThread(app).start()
        started.append(server)
        return app, server

    yield start
    for server in started:
        server.stop()


def _verified(log_dir: Path, key_file: Path) -> list[dict[str, Any]]:
    summary = verify_log(log_dir, [load_signer(key_file).verifier()])
    assert summary.unsigned_entries == 0 and summary.open_dispatches == 0
    return [r.data for _, r in LogDirectory(log_dir).records(summary.size)]


def test_a_completion_the_disk_refused_is_written_when_it_takes_writes_again(
    logged: Callable[..., tuple[GatewayApp, ServerThread]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    disk = FailingDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)
    app, server = logged(Faults(hang_rate=1.0))  # the backend holds the request
    log = app.proxy.recorder.log  # type: ignore[union-attr]
    with socket.create_connection((server.host, server.port), timeout=10) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
            + f"authorization: Bearer {TENANT_KEY}\r\n".encode()
            + b"content-type: application/json\r\n"
            + f"content-length: {len(ASK)}\r\n\r\n".encode()
            + ASK
        )
        # The dispatch record is durable: the body went out.
        until(lambda: log.size == 1, "the dispatch record", timeout=15.0)
        disk.failing = True
    # The client left: the gateway ends the request and queues its completion (499),
    # which the disk refuses.
    until(lambda: log.last_error is not None, "a failed write", timeout=15.0)
    assert log.size == 1
    disk.failing = False  # the disk is back; no request comes
    # The probe found it, and the completion went in.
    until(lambda: log.size == 2, "the completion record", timeout=15.0)
    server.stop()
    dispatch, completion = _verified(tmp_path / "log", tmp_path / "log.key")
    assert (dispatch["type"], completion["type"]) == ("dispatch", "completion")
    assert completion["status"] == 499 and completion["request_id"] == dispatch["request_id"]


def test_a_failed_final_checkpoint_is_reported_and_state_still_closes(
    logged: Callable[..., tuple[GatewayApp, ServerThread]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, server = logged(checkpoint_interval_ms=3_600_000)  # only the final one
    log = app.proxy.recorder.log  # type: ignore[union-attr]
    headers = {"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json"}
    answer = httpx.post(f"{server.url}/v1/chat/completions", content=ASK, headers=headers)
    assert answer.status_code == 200
    until(lambda: log.size == 2, "two records", timeout=15.0)
    closed: list[bool] = []
    close_state = app.state.close

    async def close() -> None:
        closed.append(True)
        await close_state()

    monkeypatch.setattr(app.state, "close", close)

    def full_disk(files: object, *, root: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(gateway.provenance.writer.store, "write_files_atomically", full_disk)
        server.stop()  # the lifespan shutdown: the final checkpoint fails
    assert closed == [True]
    assert app.shutdown_error is not None
    assert "final checkpoint was not signed" in app.shutdown_error
    assert "No space left" in app.shutdown_error

    async def reopen() -> int:  # the directory was released; the next start recovers
        signer = load_signer(tmp_path / "log.key")
        recovered = await ProvenanceLog.open(tmp_path / "log", ORIGIN, signer)
        size = recovered.size
        await recovered.close()
        return size

    assert asyncio.run(reopen()) == 2
    assert [r["type"] for r in _verified(tmp_path / "log", tmp_path / "log.key")] == [
        "dispatch",
        "completion",
    ]


KEY = "og-full-disk-test-key-0123456789"


def test_serve_exits_4_when_the_final_checkpoint_fails_and_3_when_it_cannot_recover(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "provenance": {
            "dir": "log",
            "origin": ORIGIN,
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 3_600_000,  # only the final checkpoint
        },
        "limits": {"drain_timeout_s": 5},
    }
    gateway = GatewayProcess(config, tmp_path)
    try:
        gateway.start()
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            content=ASK,
            headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
            timeout=30,
        )
        assert answer.status_code == 200
        tiles = tmp_path / "log" / "tile"
        assert not tiles.exists()  # nothing signed but the empty tree yet
        tiles.write_bytes(b"")  # where the tiles must go, a file: no checkpoint can be written
        assert gateway.stop(signal.SIGTERM) == 4, gateway.output()
        assert "final checkpoint was not signed" in gateway.stderr()

        # Restarted on that disk, it cannot recover (sign) the entries: exit 3.
        again = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--config", str(gateway.path)],
            capture_output=True,
            timeout=60,
        )
        assert again.returncode == 3, again.stderr.decode()[-3000:]

        tiles.unlink()  # the disk is back
        gateway.start()
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
    finally:
        gateway.stop(signal.SIGKILL)
    kinds = [r["type"] for r in _verified(tmp_path / "log", tmp_path / "log.key")]
    assert kinds == ["dispatch", "completion"]
    helped = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--help"], capture_output=True, timeout=60
    )
    for line in ("0  stopped", "1  did not start", "2  usage", "3  did not start", "4  stopped"):
        assert line in helped.stdout.decode()


def _chat(stream: bool) -> bytes:
    ask = {
        "model": "m",
        "max_tokens": 2,
        "stream": stream,
        "messages": [{"role": "user", "content": "x"}],
    }
    return orjson.dumps(ask)


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="prlimit is Linux's")
def test_serve_refuses_what_a_full_disk_cannot_record_and_serves_again_once_it_can(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    key = write_signing_key(tmp_path / "log.key", ORIGIN)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": True},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "provenance": {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"},
    }
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    gateway = GatewayProcess(config, tmp_path)  # its stdout and stderr: files beside the log
    receipts: dict[str, bytes] = {}

    def served(http: httpx.Client) -> None:
        for stream in (False, True):
            answer = http.post(f"{gateway.url}/v1/chat/completions", content=_chat(stream))
            assert answer.status_code == 200, answer.text
            request_id = answer.headers["x-request-id"]
            if stream:
                receipts[request_id] = stream_receipt(answer)
            else:
                receipts[request_id] = base64.b64decode(answer.headers["x-owngate-receipt"])

    def ready() -> float:
        for line in httpx.get(f"{gateway.url}/metrics", timeout=30).text.splitlines():
            if line.startswith("owngate_provenance_ready "):
                return float(line.split()[1])
        raise AssertionError("no owngate_provenance_ready")

    try:
        gateway.start()
        assert gateway.proc is not None
        # bounded: a request the log never answers fails the test instead of hanging it
        with httpx.Client(headers=headers, timeout=30) as http:
            served(http)
            resource.prlimit(gateway.proc.pid, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
            for _ in range(3):
                for stream in (False, True):
                    answer = http.post(f"{gateway.url}/v1/chat/completions", content=_chat(stream))
                    assert answer.status_code == 503, answer.text
                    assert answer.json()["error"]["code"] == "provenance_unavailable"
                    assert "x-owngate-receipt" not in answer.headers
            assert httpx.get(f"{gateway.url}/readyz", timeout=30).status_code == 503
            assert ready() == 0
            limit = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            resource.prlimit(gateway.proc.pid, resource.RLIMIT_FSIZE, limit)  # space is back
            until(lambda: ready() == 1, "the log writable again", timeout=30)
            assert httpx.get(f"{gateway.url}/readyz", timeout=30).status_code == 200
            served(http)
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
    finally:
        gateway.stop(signal.SIGKILL)
    log = str(tmp_path / "log")
    assert run_audit(["verify", log, "--key", key]) == 0
    assert len(receipts) == 4
    for request_id, receipt in receipts.items():
        path = tmp_path / f"{request_id}.receipt"
        path.write_bytes(receipt)
        assert run_audit(["receipt", "verify", str(path), "--key", key, "--log", log]) == 0
