"""`serve --workers 2`: a SIGHUP that narrows the policy reaches every worker, and each
worker's log names the set each request was decided under.

The policy files are polled only once an hour here, so only the signal reloads them: the
supervisor forwards it to both workers. Requests are sent in rounds on new connections
(the kernel spreads them over the workers, though it may give one worker a whole round)
until both workers' logs hold a dispatch; after the signal, until a whole round is
refused and both logs hold a refusal; bounded in count and time. Then every dispatch
names the first set and every refusal the second, and each log verifies on its own.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.provenance import write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess, owngate_argv, worker_pids
from tests.helpers.provenance import records, run_audit
from tests.helpers.waiting import until

ORIGIN = "test.owngate/reload-workers"
BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: [REGION]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
"""
ROUND = 16  # requests on new connections: both workers take some, whatever the kernel


def write_policy(path: Path, version: str, region: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(POLICY.replace("VERSION", version).replace("REGION", region))
    temporary.replace(path)  # atomic, as a deploy tool writes it


def send_round(url: str) -> list[int]:
    headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        return [client.post("/v1/chat/completions", json=BODY).status_code for _ in range(ROUND)]


def worker_index(pid: int) -> int:
    """The index (1..N) the supervisor gave worker `pid` (its environment)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"OWNGATE_WORKER_INDEX=")).split(b"=")[1])


def failed_reloads(stderr: str) -> list[dict[str, Any]]:
    """The workers' `policy reload failed` lines, whole ones only (a worker may be
    writing the last)."""
    lines = stderr.split("\n")[:-1]
    return [
        json.loads(line)
        for line in lines
        if line.startswith("{") and "policy reload failed" in line
    ]


def logged(log_dir: Path, kind: str) -> bool:
    """Whether both workers' logs hold a signed record of `kind` (a log with no checkpoint
    yet, its first still being signed, holds none)."""
    logs = sorted(log_dir.glob("worker-*"))
    if len(logs) != 2 or not all((d / "checkpoint").exists() for d in logs):
        return False
    return all(any(r["type"] == kind for r in records(d)) for d in logs)


def test_a_sighup_narrowing_the_policy_reaches_every_worker_and_each_log_says_which(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    (tmp_path / "policies").mkdir()
    policy = tmp_path / "policies" / "p.yaml"
    write_policy(policy, "1", "eu")
    provenance = {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"}
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "limits": {"drain_timeout_s": 10},
        "provenance": {**provenance, "checkpoint_interval_ms": 20},
        "backends": [backend("gpu", sim.url, "m")],  # eu-west-1
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "policy": {"paths": ["policies"], "reload_interval_s": 3600},
    }
    gateway = GatewayProcess(config, tmp_path, "--workers", "2").start()
    rounds = 0

    def round_until(status: int, kind: str) -> bool:
        """A round of requests, each answered `status`; True once both workers' logs
        hold a record of `kind` (the kernel may give one worker a whole round)."""
        nonlocal rounds
        rounds += 1
        assert rounds <= 30, "rounds of requests never reached both workers"
        assert send_round(gateway.url) == [status] * ROUND
        return logged(tmp_path / "log", kind)

    try:
        until(lambda: round_until(200, "dispatch"), "both workers serving", timeout=60)
        write_policy(policy, "2", "ap")
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGHUP)

        def refusing() -> bool:  # until a whole round is refused, by both workers
            nonlocal rounds
            rounds += 1
            assert rounds <= 60, "a worker kept serving under the old set"
            statuses = send_round(gateway.url)
            return set(statuses) == {403} and logged(tmp_path / "log", "refusal")

        until(refusing, "both workers refusing under the narrowed set", timeout=60)
    finally:
        gateway.stop(signal.SIGTERM)
    versions: dict[str, set[str]] = {"dispatch": set(), "refusal": set()}
    for log in sorted((tmp_path / "log").glob("worker-*")):
        for record in records(log):
            if record["type"] in versions:
                versions[record["type"]].add(record["policy"]["version"])
        assert run_audit(["verify", str(log), "--key", vkey]) == 0
    assert versions == {"dispatch": {"1"}, "refusal": {"2"}}


def test_a_worker_that_could_not_read_the_narrowed_policy_reads_it_again(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """One worker out of file descriptors (its soft limit lowered to 0 with `prlimit`)
    while the policy file is narrowed: its poll fails to read the file, the other worker's
    loads it. Once the limit is back the failed worker reads the unchanged file again and
    refuses too; before, it kept the first set (a stamp taken, no change to come) and
    served under it for as long as it ran. `/metrics` counts the failure, shows one set
    once they agree, and each log names the set of each decision."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    (tmp_path / "policies").mkdir()
    policy = tmp_path / "policies" / "p.yaml"
    write_policy(policy, "1", "eu")
    provenance = {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"}
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "limits": {"drain_timeout_s": 10},
        "provenance": {**provenance, "checkpoint_interval_ms": 20},
        "backends": [backend("gpu", sim.url, "m")],  # eu-west-1
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        # A file, not a directory: its stamp is a stat, which needs no descriptor.
        "policy": {"paths": ["policies/p.yaml"], "reload_interval_s": 0.2},
    }
    gateway = GatewayProcess(config, tmp_path, "--workers", "2").start()
    rounds = 0

    def round_until(status: int, kind: str) -> bool:
        nonlocal rounds
        rounds += 1
        assert rounds <= 30, "rounds of requests never reached both workers"
        assert send_round(gateway.url) == [status] * ROUND
        return logged(tmp_path / "log", kind)

    try:
        until(lambda: round_until(200, "dispatch"), "both workers serving", timeout=60)
        assert gateway.proc is not None
        stale = worker_pids(gateway.proc.pid)[0]
        limits = resource.prlimit(stale, resource.RLIMIT_NOFILE)
        resource.prlimit(stale, resource.RLIMIT_NOFILE, (0, limits[1]))
        try:
            write_policy(policy, "2", "ap")
            until(
                lambda: bool(failed_reloads(gateway.stderr())),
                "the worker's policy read failing",
                timeout=30,
            )
        finally:
            resource.prlimit(stale, resource.RLIMIT_NOFILE, limits)

        def refusing() -> bool:
            nonlocal rounds
            rounds += 1
            assert rounds <= 60, "a worker kept serving under the old set"
            statuses = send_round(gateway.url)
            return set(statuses) == {403} and logged(tmp_path / "log", "refusal")

        until(refusing, "both workers refusing under the narrowed set", timeout=60)
        # The supervisor's log says which worker failed to read it.
        index = worker_index(stale)
        assert {line["worker"] for line in failed_reloads(gateway.stderr())} == {index}

        def one_set() -> bool:
            text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
            sets = [s for s in text.splitlines() if s.startswith("owngate_policy_info{")]
            failures = [
                float(s.split()[-1])
                for s in text.splitlines()
                if s.startswith("owngate_policy_reload_failures_total ")
            ]
            return len(sets) == 1 and failures[0] >= 1

        until(
            one_set,
            "/metrics showing one policy set and the failed read",
            timeout=30,
            detail=lambda: [
                line
                for line in httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines()
                if "policy" in line
            ],
        )
    finally:
        gateway.stop(signal.SIGTERM)
    versions: dict[str, set[str]] = {"dispatch": set(), "refusal": set()}
    for log in sorted((tmp_path / "log").glob("worker-*")):
        for record in records(log):
            if record["type"] in versions:
                versions[record["type"]].add(record["policy"]["version"])
        assert run_audit(["verify", str(log), "--key", vkey]) == 0
    assert versions == {"dispatch": {"1"}, "refusal": {"2"}}


def test_a_worker_whose_log_cannot_be_opened_says_which_worker_it_is(tmp_path: Path) -> None:
    # uvicorn logs why the app refused to start through stdlib logging, which structlog's
    # contextvars (where the worker index was bound) never reach: the refusal of worker 2
    # of N had no `worker`, though the docs say every line a worker logs carries it.
    write_signing_key(tmp_path / "log.key", ORIGIN)
    (tmp_path / "log").write_text("a file where the log directory should be")
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "provenance": {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"},
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
    }
    (tmp_path / "gateway.yaml").write_text(json.dumps(config))
    (tmp_path / "run").mkdir()
    env = {**os.environ, "OWNGATE_WORKER_INDEX": "2", "OWNGATE_WORKER_RUNTIME_DIR": "run"}
    done = subprocess.run(
        owngate_argv("serve", "--config", "gateway.yaml"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 3, stderr
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    refused = [line for line in lines if "provenance log" in line["event"]]
    assert refused, stderr
    assert all(line.get("worker") == 2 for line in lines), stderr
