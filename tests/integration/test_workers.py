"""`owngate serve --workers 2` as real processes: shared port, summed metrics, one
provenance log per worker, restart of a dead worker, clean stop on SIGTERM."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.fleet import merge_expositions
from gateway.provenance import load_verifiers, verify_log, verify_receipt, write_signing_key
from gateway.tenants import hash_api_key
from gateway.worker_identity import WorkerIdentity, for_worker
from tests.helpers.gateways import Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess, worker_pids
from tests.helpers.provenance import records
from tests.helpers.waiting import until

ORIGIN = "test.owngate/workers"
REQUESTS = 120
BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
def workers(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[tuple[GatewayProcess, str]]:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "limits": {"drain_timeout_s": 10},
        "provenance": {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
    }
    gateway = GatewayProcess(config, tmp_path, "--workers", "2").start()
    yield gateway, vkey
    gateway.stop(signal.SIGKILL)


def send_requests(url: str, count: int, verifiers_key: str) -> dict[str, int]:
    """`count` requests, each on a new connection; how many each worker's log took."""
    by_log: dict[str, int] = {}
    verifiers = load_verifiers([verifiers_key])
    headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        for _ in range(count):
            response = client.post("/v1/chat/completions", json=BODY)
            assert response.status_code == 200, response.text
            envelope = base64.b64decode(response.headers["x-owngate-receipt"])
            origin = verify_receipt(envelope, verifiers).log
            by_log[origin] = by_log.get(origin, 0) + 1
    return by_log


def served(url: str) -> float:
    """The chat requests answered 200, as one scrape of /metrics reports them."""
    text = httpx.get(f"{url}/metrics", headers={"connection": "close"}, timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "owngate_requests_total" and sample.labels["status"] == "200":
                total += sample.value
    return total


def test_two_workers_share_the_port_and_the_metrics_add_up(
    workers: tuple[GatewayProcess, str], tmp_path: Path
) -> None:
    gateway, vkey = workers
    assert gateway.proc is not None
    until(lambda: len(worker_pids(gateway.proc.pid)) == 2, "two workers", timeout=15.0)  # type: ignore[union-attr]
    by_log = send_requests(gateway.url, REQUESTS, vkey)
    assert sorted(by_log) == [f"{ORIGIN}/worker-1", f"{ORIGIN}/worker-2"]  # both got traffic
    assert sum(by_log.values()) == REQUESTS
    # Any worker's /metrics gives the sum (the others' snapshots are at most 0.5 s old):
    # soon every scrape, whichever worker answers it, counts every request once.
    until(
        lambda: [served(gateway.url) for _ in range(6)] == [REQUESTS] * 6,
        "the summed count",
        timeout=15.0,
        detail=lambda: httpx.get(f"{gateway.url}/metrics").text,
    )

    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.wait(timeout_s=60) == 0, gateway.output()
    verifiers = load_verifiers([vkey])
    for worker, count in ((1, by_log[f"{ORIGIN}/worker-1"]), (2, by_log[f"{ORIGIN}/worker-2"])):
        summary = verify_log(tmp_path / "log" / f"worker-{worker}", verifiers)
        assert summary.origin == f"{ORIGIN}/worker-{worker}"
        assert summary.size == 2 * count  # a dispatch and a completion per request
        assert summary.unsigned_entries == 0


def test_a_dead_worker_is_restarted(workers: tuple[GatewayProcess, str], tmp_path: Path) -> None:
    gateway, vkey = workers
    assert gateway.proc is not None
    supervisor = gateway.proc.pid
    until(lambda: len(worker_pids(supervisor)) == 2, "two workers", timeout=15.0)
    victim = worker_pids(supervisor)[0]
    os.kill(victim, signal.SIGKILL)
    until(
        lambda: len(worker_pids(supervisor)) == 2 and victim not in worker_pids(supervisor),
        "a replacement worker",
        timeout=15.0,
    )
    until(lambda: _both_serve(gateway.url, vkey), "both workers serving", timeout=15.0)
    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.wait(timeout_s=60) == 0, gateway.output()
    for worker in (1, 2):  # the killed worker's log recovered when it restarted
        verify_log(tmp_path / "log" / f"worker-{worker}", load_verifiers([vkey]))


def test_merge_sums_counters_and_inflight_but_not_info_gauges() -> None:
    one = (
        "# TYPE owngate_requests_total counter\n"
        'owngate_requests_total{endpoint="chat",status="200",backend="gpu"} 3\n'
        "# TYPE owngate_backend_inflight gauge\n"
        'owngate_backend_inflight{backend="gpu"} 2\n'
        "# TYPE owngate_build_info gauge\n"
        'owngate_build_info{version="1"} 1\n'
        "# TYPE owngate_request_duration_seconds histogram\n"
        'owngate_request_duration_seconds_bucket{endpoint="chat",le="+Inf"} 3\n'
        'owngate_request_duration_seconds_count{endpoint="chat"} 3\n'
        'owngate_request_duration_seconds_sum{endpoint="chat"} 0.5\n'
    )
    two = one.replace("} 3\n", "} 4\n").replace("} 2\n", "} 5\n")
    two = two.replace(
        "owngate_requests_total{",
        'owngate_requests_total{endpoint="chat",status="500",backend="gpu"} 1\n'
        "owngate_requests_total{",
    )
    merged = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(merge_expositions([one, two]).decode())
        for s in f.samples
    }
    chat = (("backend", "gpu"), ("endpoint", "chat"), ("status", "200"))
    assert merged[("owngate_requests_total", chat)] == 7
    assert merged[("owngate_requests_total", (*chat[:2], ("status", "500")))] == 1
    assert merged[("owngate_backend_inflight", (("backend", "gpu"),))] == 7
    assert merged[("owngate_build_info", (("version", "1"),))] == 1
    assert merged[("owngate_request_duration_seconds_count", (("endpoint", "chat"),))] == 7
    assert merged[("owngate_request_duration_seconds_sum", (("endpoint", "chat"),))] == 1.0


def test_merge_shows_the_log_backlog_of_the_worker_nearest_its_bound() -> None:
    # Each worker's log holds its own unsigned entries against its own
    # provenance.max_unsigned_bytes: a scrape shows the fullest, whichever worker answers
    # (before, the answering worker's own: 0 on one scrape, at the bound on the next).
    full = (
        "# TYPE owngate_provenance_ready gauge\nowngate_provenance_ready 0\n"
        "# TYPE owngate_provenance_unsigned_bytes gauge\n"
        "owngate_provenance_unsigned_bytes 201065\n"
    )
    fine = full.replace(" 0\n", " 1\n").replace(" 201065\n", " 0\n")
    for texts in ([fine, full], [full, fine]):
        merged = {
            s.name: s.value
            for f in text_string_to_metric_families(merge_expositions(texts).decode())
            for s in f.samples
        }
        assert merged["owngate_provenance_unsigned_bytes"] == 201065
        assert merged["owngate_provenance_ready"] == 0


def test_each_worker_gets_its_own_log_and_replica_id() -> None:
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")],
        provenance={"dir": "log", "origin": "gw.example/log", "signing_key_file": "k"},
        state={"backend": "memory", "replica_id": "pod-a"},
    )
    mine = for_worker(WorkerIdentity(2, Path("/tmp/rt")))(config)
    assert mine.provenance is not None and config.provenance is not None
    assert (mine.provenance.dir, mine.provenance.origin) == (
        "log/worker-2",
        "gw.example/log/worker-2",
    )
    assert mine.state.replica_id == "pod-a-worker-2"
    assert config.state.replica_id == "pod-a"  # the loaded config is left alone
    assert for_worker(None)(config) is config


def _both_serve(url: str, vkey: str) -> bool:
    """Whether 20 new connections reach both workers' logs. A connection the kernel resets
    or refuses while the killed worker's socket leaves the port's group (its queued
    connections are reset) counts as not yet: the wait is for the replacement serving."""
    try:
        return len(send_requests(url, 20, vkey)) == 2
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
        return False


def _listening(port: int) -> int:
    """Sockets listening on 127.0.0.1:`port` (the supervisor's reserved one never does)."""
    local = f"0100007F:{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[1] == local and line.split()[3] == "0A")


def _events(gateway: GatewayProcess, event: str) -> int:
    lines = (gateway.stdout() + gateway.stderr()).splitlines()
    return sum(f'"event":"{event}"' in line for line in lines)


def test_a_worker_takes_no_connection_before_its_app_has_started(tmp_path: Path) -> None:
    """A restarted worker's startup waits for its first probe of the backends (here one
    that never answers: `scrape.timeout_s`). Before, its socket listened from before that
    wait: the kernel queued new connections on it, where they waited while the other
    worker was idle, and were reset when a startup failed (its log could not be opened:
    such a worker is retried every 5 s, and each try cost clients their connections)."""
    silent = socket.socket()  # accepts into its backlog, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "info", "access_log": False},
        "limits": {"drain_timeout_s": 5},
        "scrape": {"timeout_s": 6, "interval_s": 1, "staleness_s": 3},
        "backends": [backend("gpu", f"http://127.0.0.1:{silent.getsockname()[1]}", "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
    }
    gateway = GatewayProcess(config, tmp_path, "--workers", "2").start(timeout_s=90)
    try:
        assert gateway.proc is not None
        supervisor = gateway.proc.pid
        until(lambda: _events(gateway, "Application startup complete.") == 2, "both started")
        assert _listening(port) == 2
        victim = worker_pids(supervisor)[0]
        os.kill(victim, signal.SIGKILL)
        # Its replacement has bound the port (it says "starting" after) and now waits
        # seconds for the silent backend before its app starts.
        until(lambda: _events(gateway, "starting") == 3, "the replacement binding", timeout=30)
        listening = _listening(port)
        assert _events(gateway, "Application startup complete.") == 2  # still starting
        assert listening == 1  # the other worker's only
        until(lambda: _listening(port) == 2, "the replacement listening", timeout=30)
    finally:
        gateway.stop(signal.SIGKILL)
        silent.close()


def _worker_pid(supervisor: int, index: int) -> int:
    for pid in worker_pids(supervisor):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"OWNGATE_WORKER_INDEX={index}".encode() in environ:
            return pid
    raise AssertionError(f"no worker {index} under {supervisor}")


def _recorded_size(high_water: Path) -> int:
    """The size of the checkpoint a high-water file records (its first note's 2nd line)."""
    return int(high_water.read_text().split("\n")[1])


def test_a_worker_restarted_on_a_lost_log_refuses_it_and_continues_it_once_back(
    workers: tuple[GatewayProcess, str], tmp_path: Path
) -> None:
    """Worker 2's log directory is swapped for an empty one and worker 2 dies. Its
    replacement finds less than its high-water file says was signed: it refuses to start
    (a fork of its log) and is retried while worker 1 serves every request, logged in
    worker 1's log alone. Once the directory is back, worker 2 starts on it, recovers
    what it wrote before it died and continues the same log."""
    gateway, vkey = workers
    assert gateway.proc is not None
    supervisor = gateway.proc.pid
    until(lambda: len(worker_pids(supervisor)) == 2, "two workers", timeout=15.0)
    until(lambda: _both_serve(gateway.url, vkey), "both workers serving", timeout=15.0)
    before = send_requests(gateway.url, 20, vkey)
    log2 = tmp_path / "log" / "worker-2"
    high_water = tmp_path / "log.high-water-worker-2"
    # A checkpoint signed and recorded in the high-water file (written after the log's
    # own files: a worker that dies in between leaves it behind, by design, and the lost
    # directory would then go unnoticed: docs/provenance.md, "Starting over").
    until(
        lambda: high_water.is_file() and _recorded_size(high_water) == len(records(log2)) > 0,
        "a checkpoint of worker 2's, recorded",
        timeout=15.0,
    )
    signed = _recorded_size(high_water)
    log2.rename(tmp_path / "kept")
    log2.mkdir()
    victim = _worker_pid(supervisor, 2)
    os.kill(victim, signal.SIGKILL)
    until(
        lambda: "going on would fork it" in gateway.output(),
        "worker 2 refusing",
        timeout=30.0,
        detail=gateway.output,
    )
    during = send_requests(gateway.url, 40, vkey)  # new connections: worker 1 alone
    assert during == {f"{ORIGIN}/worker-1": 40}
    assert sorted(p.name for p in log2.iterdir()) in ([], [".lock"])  # nothing signed there
    assert _recorded_size(high_water) == signed  # nor recorded
    shutil.rmtree(log2)
    (tmp_path / "kept").rename(log2)
    until(lambda: _both_serve(gateway.url, vkey), "worker 2 back", timeout=30.0)
    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.wait(timeout_s=60) == 0, gateway.output()
    verifiers = load_verifiers([vkey])
    summary = verify_log(log2, verifiers)  # one log, continued across the crash
    assert summary.origin == f"{ORIGIN}/worker-2" and summary.unsigned_entries == 0
    assert summary.size >= 2 * before.get(f"{ORIGIN}/worker-2", 0)
    verify_log(tmp_path / "log" / "worker-1", verifiers)
