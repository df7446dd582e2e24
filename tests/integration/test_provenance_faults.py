"""Faults in the provenance log during live requests: no request is answered whose
dispatch record the log lost, the fault shows (503 `provenance_unavailable`, `/readyz`,
`owngate_provenance_ready`, one log line), and nothing acknowledged is lost to a crash.

- The log directory deleted under a running gateway: the open write-ahead segment still
  takes writes (in no file anyone will read), so the gateway must refuse, not answer 200.
- `owngate serve` killed (SIGKILL) while clients are being answered, then restarted: the
  log recovers and verifies, and every request a client got a 200 for is in it, at the
  index its receipt names. (Completions queued for `deferred_flush_ms` when it died may
  be lost: those dispatches show as open, which `audit verify` reports and passes.)
- One worker of `owngate serve --workers 2` killed (SIGKILL) while streams and whole
  answers are being served: its replacement recovers its log, every worker's log
  verifies, and every receipt a client got (header or stream line) verifies against the
  log it names with `owngate audit receipt verify --log`.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.api import GatewayApp
from gateway.app import create_app
from gateway.provenance import (
    LogDirectory,
    load_signer,
    verify_log,
    verify_receipt,
    write_signing_key,
)
from gateway.provenance.formats.merkle import leaf_hash
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess, worker_pids
from tests.helpers.provenance import run_audit, run_audit_output
from tests.helpers.stream_receipts import owngate_lines, stream_receipt
from tests.helpers.waiting import until

ORIGIN = "test.owngate/log/faults"
ASK = orjson.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
HEADERS = {"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json"}


@pytest.fixture
def logged(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    started: list[ServerThread] = []

    def start(**provenance: Any) -> tuple[GatewayApp, ServerThread]:
        write_signing_key(tmp_path / "log.key", ORIGIN)
        sim = start_sim("vllm", models=("m",), zero_latency=True)
        config = gateway_config(
            [backend("gpu", sim.url, "m")],
            provenance={"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"} | provenance,
        )
        app = create_app(config, environ={}, config_dir=tmp_path)
        server = ServerThread(app).start()
        started.append(server)
        return app, server

    yield start
    for server in started:
        server.stop()


def test_a_deleted_log_directory_is_refused_and_said_so(
    logged: Callable[..., tuple[GatewayApp, ServerThread]],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Only the final checkpoint: the segment the first request opened stays open.
    _, server = logged(checkpoint_interval_ms=3_600_000)
    url = f"{server.url}/v1/chat/completions"
    assert httpx.post(url, content=ASK, headers=HEADERS, timeout=30).status_code == 200
    shutil.rmtree(tmp_path / "log")
    answers = [httpx.post(url, content=ASK, headers=HEADERS, timeout=30) for _ in range(3)]
    for answer in answers:
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "provenance_unavailable"
        assert set(error) == {"message", "type", "param", "code"}
        assert "x-owngate-receipt" not in answer.headers
    assert httpx.get(f"{server.url}/readyz").status_code == 503
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "owngate_provenance_ready 0.0" in metrics.splitlines()
    (tmp_path / "log").mkdir()  # a new directory of that name is not the log either
    answer = httpx.post(url, content=ASK, headers=HEADERS, timeout=30)
    assert answer.status_code == 503, answer.text
    printed = "".join(capfd.readouterr())  # the gateway's log lines
    assert printed.count("provenance log not writable") == 1, printed
    assert "the segment was removed" in printed


def test_a_receipt_the_signer_fails_is_counted_and_the_answer_says_it_has_none(
    logged: Callable[..., tuple[GatewayApp, ServerThread]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The record is durable, so the answer goes out; before, it went without its receipt
    # and without a word (a log line, no metric): a client could not tell it from a
    # gateway that gives no receipts, an operator could not alert on it.
    def refused(*args: object, **kwargs: object) -> list[bytes]:
        raise ValueError("the signing key is gone")

    monkeypatch.setattr("gateway.api.recorder_log.seal_receipts", refused)
    app, server = logged()
    url = f"{server.url}/v1/chat/completions"
    answer = httpx.post(url, content=ASK, headers=HEADERS, timeout=30)
    assert answer.status_code == 200, answer.text
    assert "x-owngate-receipt" not in answer.headers
    assert answer.headers["x-owngate-receipt-missing"] == "signing-failed"
    stream = orjson.dumps({**orjson.loads(ASK), "stream": True})
    streamed = httpx.post(url, content=stream, headers=HEADERS, timeout=30)
    assert streamed.status_code == 200 and "owngate-receipt" not in streamed.text
    metrics = httpx.get(f"{server.url}/metrics").text.splitlines()
    assert "owngate_receipt_failures_total 2.0" in metrics
    assert app.parts.recorder is not None and app.parts.recorder.log.size >= 2  # logged


def test_a_hung_checkpoint_export_shows_in_readiness_and_metrics(
    logged: Callable[..., tuple[GatewayApp, ServerThread]], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, server = logged(checkpoint_interval_ms=1, export_stall_after_s=1)
    assert app.parts.recorder is not None
    store = app.parts.recorder.log.store
    export, release, entered = store.export, threading.Event(), threading.Event()

    def hung(*args: Any) -> Any:  # on the log's checkpoint thread
        entered.set()
        release.wait(60)
        return export(*args)

    monkeypatch.setattr(store, "export", hung)

    def metric(name: str) -> float:
        for line in httpx.get(f"{server.url}/metrics").text.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        raise AssertionError(f"no {name}")

    url = f"{server.url}/v1/chat/completions"
    try:
        assert httpx.post(url, content=ASK, headers=HEADERS, timeout=30).status_code == 200
        assert entered.wait(30)
        # export_stall_after_s (1 s) later the export counts as hung: not ready, age shown
        until(
            lambda: metric("owngate_provenance_ready") == 0,
            "not ready",
            timeout=30,
            interval=0.1,
        )
        assert metric("owngate_provenance_export_age_seconds") > 0
        assert httpx.get(f"{server.url}/readyz").status_code == 503
        assert httpx.post(url, content=ASK, headers=HEADERS, timeout=30).status_code == 200
    finally:
        release.set()
    until(lambda: metric("owngate_provenance_ready") == 1, "ready again", timeout=30)


KEY = "og-faults-test-key-0123456789abcd"


def _killed_config(sim_url: str, level: str) -> dict[str, Any]:
    """A gateway over one simulated backend whose log checkpoints (and rotates its
    segments) every 64 records, so a kill lands among checkpoints."""
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": level, "access_log": False},
        "backends": [backend("gpu", sim_url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "provenance": {
            "dir": "log",
            "origin": ORIGIN,
            "signing_key_file": "log.key",
            "checkpoint_every": 64,
        },
    }


def test_a_gateway_killed_mid_traffic_lost_no_answered_request(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    config = _killed_config(sim.url, "warning")
    gateway = GatewayProcess(config, tmp_path).start()
    answered: dict[str, bytes] = {}  # request id -> the receipt the client got
    lock = threading.Lock()
    enough = threading.Event()
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            for _ in range(500):  # bounded; the gateway is killed long before
                try:
                    answer = http.post(
                        f"{gateway.url}/v1/chat/completions", content=ASK, headers=headers
                    )
                except httpx.TransportError:
                    return  # killed
                if answer.status_code == 200:
                    receipt = base64.b64decode(answer.headers["x-owngate-receipt"])
                    with lock:
                        answered[answer.headers["x-request-id"]] = receipt
                        if len(answered) >= 120:
                            enough.set()

    try:
        with ThreadPoolExecutor(12) as pool:
            clients = [pool.submit(client) for _ in range(12)]
            assert enough.wait(timeout=120), "the clients got too few answers"
            gateway.stop(signal.SIGKILL)  # while the other clients are still being answered
            for done in clients:
                done.result()
        gateway.start()  # recovers the write-ahead segment and signs it
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
    finally:
        gateway.stop(signal.SIGKILL)
    log_dir = tmp_path / "log"
    assert run_audit(["verify", str(log_dir), "--key", vkey]) == 0
    verifier = load_signer(tmp_path / "log.key").verifier()
    summary = verify_log(log_dir, [verifier])
    assert summary.unsigned_entries == 0
    directory = LogDirectory(log_dir)
    entries = dict(directory.entries(summary.size))
    dispatches = {
        record.request_id: index
        for index, record in directory.records(summary.size)
        if record.type == "dispatch"
    }
    missing = sorted(set(answered) - set(dispatches))
    assert not missing, f"{len(missing)} of {len(answered)} answered requests are not in the log"
    for request_id, envelope in answered.items():
        receipt = verify_receipt(envelope, [verifier])
        assert receipt.request_id == request_id
        assert receipt.index == dispatches[request_id]
        assert receipt.dispatch_hash == leaf_hash(entries[receipt.index])


def _started(gateway: GatewayProcess) -> int:
    """How many times a worker's app has started."""
    lines = (gateway.stdout() + gateway.stderr()).splitlines()
    return sum('"event":"Application startup complete."' in line for line in lines)


def test_a_worker_killed_mid_streams_lost_no_receipt_it_handed_out(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    config = _killed_config(sim.url, "info")
    gateway = GatewayProcess(config, tmp_path, "--workers", "2").start(timeout_s=90)
    assert gateway.proc is not None
    supervisor = gateway.proc.pid
    until(lambda: len(worker_pids(supervisor)) == 2, "two workers", timeout=30)
    victim = worker_pids(supervisor)[0]
    answered: dict[str, bytes] = {}  # request id -> the receipt the client got
    after: set[str] = set()  # the logs that handed out receipts after the kill
    lock = threading.Lock()
    killed, enough, done = threading.Event(), threading.Event(), threading.Event()
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    headers["connection"] = "close"  # each request a new connection: both workers get some

    def ask(stream: bool) -> bytes:
        chat = {"model": "m", "max_tokens": 4, "stream": stream}
        return orjson.dumps(chat | {"messages": [{"role": "user", "content": "x"}]})

    def client(number: int) -> None:
        with httpx.Client(timeout=30) as http:
            for turn in range(2000):  # bounded; `done` ends it long before
                if done.is_set():
                    return
                stream = (number + turn) % 2 == 0
                try:
                    answer = http.post(
                        f"{gateway.url}/v1/chat/completions", content=ask(stream), headers=headers
                    )
                except httpx.TransportError:
                    continue  # its worker was killed mid-answer: no receipt reached it
                if answer.status_code != 200:
                    continue
                if stream and not owngate_lines(answer.content):
                    continue  # cut before its receipt line
                receipt = (
                    stream_receipt(answer)
                    if stream
                    else base64.b64decode(answer.headers["x-owngate-receipt"])
                )
                with lock:
                    answered[answer.headers["x-request-id"]] = receipt
                    if killed.is_set():
                        after.add(
                            orjson.loads(base64.b64decode(orjson.loads(receipt)["payload"]))["log"]
                        )
                    if len(answered) >= (160 if killed.is_set() else 80) and (
                        not killed.is_set() or len(after) == 2
                    ):
                        enough.set()

    try:
        with ThreadPoolExecutor(8) as pool:
            clients = [pool.submit(client, number) for number in range(8)]
            try:
                assert enough.wait(timeout=120), "the clients got too few answers"
                enough.clear()
                os.kill(victim, signal.SIGKILL)  # while the other clients are being answered
                until(
                    lambda: (
                        len(worker_pids(supervisor)) == 2 and victim not in worker_pids(supervisor)
                    ),
                    "a replacement worker",
                    timeout=30,
                )
                until(lambda: _started(gateway) == 3, "the replacement serving", timeout=60)
                killed.set()  # from now on, both workers' logs must hand out receipts
                assert enough.wait(timeout=120), "too few answers after the kill"
            finally:
                done.set()
            for future in clients:
                future.result()
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
    finally:
        gateway.stop(signal.SIGKILL)
    for worker in (1, 2):
        code, printed = run_audit_output(
            ["verify", str(tmp_path / "log" / f"worker-{worker}"), "--key", vkey]
        )
        assert code == 0, f"worker-{worker}'s log: {printed}\n{gateway.output()}"
    for request_id, receipt in answered.items():
        payload = orjson.loads(base64.b64decode(orjson.loads(receipt)["payload"]))
        assert payload["request_id"] == request_id
        worker = payload["log"].removeprefix(f"{ORIGIN}/")
        path = tmp_path / f"{request_id}.receipt"
        path.write_bytes(receipt)
        log = str(tmp_path / "log" / worker)
        code, printed = run_audit_output(
            ["receipt", "verify", str(path), "--key", vkey, "--log", log]
        )
        assert code == 0, f"the receipt of {request_id} ({payload}): {printed}\n{gateway.output()}"
