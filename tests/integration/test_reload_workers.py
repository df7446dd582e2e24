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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess, owngate_argv, worker_pids
from tests.helpers.provenance import records, run_audit
from tests.helpers.reload_files import versioned_policy
from tests.helpers.waiting import until

ORIGIN = "test.owngate/reload-workers"
BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
ROUND = 16  # requests on new connections: both workers take some, whatever the kernel


def write_policy(path: Path, version: str, region: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(versioned_policy(version, region))
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


def failed_after_sibling_loaded(stderr: str, stale: int) -> bool:
    """Whether worker `stale` logged a failed policy read after its sibling logged loading
    a new set (whole lines of `stderr`, in the order the workers wrote them)."""
    seen_loaded = False
    for line in stderr.split("\n")[:-1]:
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("event") == "policy set loaded" and entry.get("worker") != stale:
            seen_loaded = True
        elif (
            seen_loaded
            and "policy reload failed" in entry.get("event", "")
            and entry.get("worker") == stale
        ):
            return True
    return False


def logged(log_dir: Path, kind: str) -> bool:
    """Whether both workers' logs hold a signed record of `kind` (a log with no checkpoint
    yet, its first still being signed, holds none)."""
    logs = sorted(log_dir.glob("worker-*"))
    if len(logs) != 2 or not all((d / "checkpoint").exists() for d in logs):
        return False
    return all(any(r["type"] == kind for r in records(d)) for d in logs)


def start_workers(
    start_sim: Callable[..., Sim], tmp_path: Path, policy: dict[str, Any]
) -> tuple[GatewayProcess, str]:
    """`serve --workers 2` before one simulated backend, its policy files under
    `policies/` (`p.yaml`: version 1, eu) loaded as the `policy` section says, each
    worker's log under `log/`; the gateway and the log's verifier key."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    (tmp_path / "policies").mkdir()
    write_policy(tmp_path / "policies" / "p.yaml", "1", "eu")
    provenance = {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"}
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        # info: each worker's "policy set loaded" line says when it holds a new set
        "logging": {"format": "json", "level": "info", "access_log": False},
        "limits": {"drain_timeout_s": 10},
        "provenance": {**provenance, "checkpoint_interval_ms": 20},
        "backends": [backend("gpu", sim.url, "m")],  # eu-west-1
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "policy": policy,
    }
    gateway = GatewayProcess(config, tmp_path, "--workers", "2")
    # Written well before the start: the config watcher's first look does not read them
    # again (a read that fails while a test holds a worker out of file descriptors makes
    # its config stale, which would answer for the policy's)
    aged = time.time_ns() - 60 * 10**9
    for written in (gateway.path, tmp_path / "policies" / "p.yaml"):
        os.utime(written, ns=(aged, aged))
    return gateway.start(), vkey


class Rounds:
    """Rounds of requests to the gateway at `url`, counted across the test (bounded)."""

    def __init__(self, url: str, log_dir: Path) -> None:
        self.url = url
        self.log_dir = log_dir
        self.count = 0

    def serving(self) -> bool:
        """A round, each request answered 200; True once both workers' logs hold a
        dispatch (the kernel may give one worker a whole round)."""
        self.count += 1
        assert self.count <= 30, "rounds of requests never reached both workers"
        assert send_round(self.url) == [200] * ROUND
        return logged(self.log_dir, "dispatch")

    def refusing(self) -> bool:
        """A round; True once it was refused whole and both workers' logs hold a refusal."""
        self.count += 1
        assert self.count <= 60, "a worker kept serving under the old set"
        statuses = send_round(self.url)
        return set(statuses) == {404} and logged(self.log_dir, "refusal")  # hidden: 404


def assert_each_log_names_its_set(log_dir: Path, vkey: str) -> None:
    """Every dispatch names policy version 1 and every refusal version 2, and each
    worker's log verifies on its own."""
    versions: dict[str, set[str]] = {"dispatch": set(), "refusal": set()}
    for log in sorted(log_dir.glob("worker-*")):
        for record in records(log):
            if record["type"] in versions:
                versions[record["type"]].add(record["policy"]["version"])
        assert run_audit(["verify", str(log), "--key", vkey]) == 0
    assert versions == {"dispatch": {"1"}, "refusal": {"2"}}


def test_a_sighup_narrowing_the_policy_reaches_every_worker_and_each_log_says_which(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    gateway, vkey = start_workers(
        start_sim, tmp_path, {"paths": ["policies"], "reload_interval_s": 3600}
    )
    rounds = Rounds(gateway.url, tmp_path / "log")
    try:
        until(rounds.serving, "both workers serving", timeout=60)
        write_policy(tmp_path / "policies" / "p.yaml", "2", "ap")
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGHUP)
        until(rounds.refusing, "both workers refusing under the narrowed set", timeout=60)
    finally:
        gateway.stop(signal.SIGTERM)
    assert_each_log_names_its_set(tmp_path / "log", vkey)


def test_a_worker_that_could_not_read_the_narrowed_policy_reads_it_again(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """One worker out of file descriptors (its soft limit lowered to 0 with `prlimit`)
    while the policy file is narrowed: its poll fails to read the file, the other worker's
    loads it. Once the limit is back the failed worker reads the unchanged file again and
    refuses too; before, it kept the first set (a stamp taken, no change to come) and
    served under it for as long as it ran. `/metrics` counts the failure, shows one set
    once they agree, and each log names the set of each decision."""
    # A file, not a directory: its stamp is a stat, which needs no descriptor.
    gateway, vkey = start_workers(
        start_sim, tmp_path, {"paths": ["policies/p.yaml"], "reload_interval_s": 0.2}
    )
    rounds = Rounds(gateway.url, tmp_path / "log")
    try:
        until(rounds.serving, "both workers serving", timeout=60)
        assert gateway.proc is not None
        stale = worker_pids(gateway.proc.pid)[0]
        limits = resource.prlimit(stale, resource.RLIMIT_NOFILE)
        resource.prlimit(stale, resource.RLIMIT_NOFILE, (0, limits[1]))
        try:
            write_policy(tmp_path / "policies" / "p.yaml", "2", "ap")
            until(
                lambda: bool(failed_reloads(gateway.stderr())),
                "the worker's policy read failing",
                timeout=30,
            )
        finally:
            resource.prlimit(stale, resource.RLIMIT_NOFILE, limits)

        until(rounds.refusing, "both workers refusing under the narrowed set", timeout=60)
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
    assert_each_log_names_its_set(tmp_path / "log", vkey)


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


@pytest.mark.parametrize("paths", [["policies/p.yaml"], ["policies"]])
def test_a_worker_that_could_not_read_the_narrowed_policy_refuses_until_it_does(
    start_sim: Callable[..., Sim], tmp_path: Path, paths: list[str]
) -> None:
    """As above, but the files are looked at every 5 s: between the failed read and the
    next look, the worker that could not read the narrowed file holds the older, looser
    set while its sibling enforces the new one. It refuses every request 503 (retry
    after 1 s) and `/readyz` says not ready, so no request is decided under the older
    set; before, its share of a round was served 200 under it, for up to 64 looks. A
    policy directory too: before, the OSError of listing it escaped each look, and the
    worker, never stale, served 200 under the older set."""
    gateway, vkey = start_workers(start_sim, tmp_path, {"paths": paths, "reload_interval_s": 5})
    rounds = Rounds(gateway.url, tmp_path / "log")
    try:
        until(rounds.serving, "both workers serving", timeout=60)
        assert gateway.proc is not None
        stale = worker_pids(gateway.proc.pid)[0]
        index = worker_index(stale)
        limits = resource.prlimit(stale, resource.RLIMIT_NOFILE)
        resource.prlimit(stale, resource.RLIMIT_NOFILE, (0, limits[1]))
        try:
            before = len(gateway.stderr())  # from here on, lines of the narrowed set
            write_policy(tmp_path / "policies" / "p.yaml", "2", "ap")
            # Each worker looks on its own clock: the round must wait for the sibling to
            # hold the new set, and for a failed look of the stale one after that, so its
            # next look (and read) is a whole interval away when the limit is back.
            until(
                lambda: failed_after_sibling_loaded(gateway.stderr()[before:], index),
                "the sibling loading the narrowed set, then the worker's read failing",
                timeout=60,
                interval=0.02,
                detail=lambda: [line for line in gateway.stderr().splitlines() if "policy" in line],
            )
        finally:
            resource.prlimit(stale, resource.RLIMIT_NOFILE, limits)
        headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as client:
            answers = [client.post("/v1/chat/completions", json=BODY) for _ in range(ROUND)]
            ready = {client.get("/readyz").status_code for _ in range(ROUND)}
        statuses = [answer.status_code for answer in answers]
        assert 200 not in statuses, statuses  # before: the stale worker's share
        # The worker's gateway.yaml watcher sees a policy directory's rename too, on a clock
        # of its own: its look can come just after the limit is back (23 ms after the
        # failed one, seen on a busy machine) and read the narrowed set. Then both workers
        # enforce it and every answer is the sibling's kind of refusal: right, but the
        # round shows no stale worker (it still shows no answer under the older set).
        reread = read_after_failing(gateway.stderr()[before:], index)
        assert set(statuses) == ({404} if reread and 503 not in statuses else {404, 503}), statuses
        for answer in answers:
            if answer.status_code == 503:
                assert answer.headers["retry-after"] == "1"
                error = answer.json()["error"]
                assert error["type"] == "service_unavailable", error
                # A policy directory's rename is a change the config watcher sees too:
                # its own re-read fails alike, and either stale refusal names its files.
                assert any(why in error["message"] for why in ("trust-policy", "config files")), (
                    error
                )
        assert ready == {200, 503} or read_after_failing(gateway.stderr()[before:], index), ready

        def all_ready() -> bool:
            with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as client:
                return {client.get("/readyz").status_code for _ in range(ROUND)} == {200}

        # At its next look it reads the file, and is ready again, under the new set.
        until(all_ready, "the stale worker ready again", timeout=30, interval=0.5)
        until(rounds.refusing, "both workers refusing under the narrowed set", timeout=60)
    finally:
        gateway.stop(signal.SIGTERM)
    assert_each_log_names_its_set(tmp_path / "log", vkey)


def read_after_failing(stderr: str, worker: int) -> bool:
    """Whether `worker`, after a failed policy read (whole lines of `stderr`), read the
    files again and installed what it read: a policy set or a whole config."""
    failed = False
    for line in stderr.split("\n")[:-1]:
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("worker") != worker:
            continue
        event = entry.get("event", "")
        if "policy reload failed" in event:
            failed = True
        elif failed and event in ("policy set loaded", "config reloaded"):
            return True
    return False


def failed_on_content(stderr: str, worker: int) -> bool:
    """Whether `worker` logged a failed policy read that read the file (invalid content,
    not `cannot read`), in whole lines of `stderr`."""
    return any(
        line.get("worker") == worker and not any("cannot read" in p for p in line["problems"])
        for line in failed_reloads(stderr)
    )


def test_a_stale_worker_whose_next_read_finds_invalid_content_stays_stale(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """The worker that could not read the narrowed file (version 2) reads, once its limit
    is back, a file an operator rewrote with a typo: refused by both workers, each keeps
    its set, the sibling version 2 and this one version 1. This one still holds the set
    its sibling left, so it stays stale (503, not ready); before, the failed read of the
    invalid file cleared the flag and it served 200 under version 1 beside the sibling's
    404 under version 2, until the next valid change."""
    gateway, vkey = start_workers(
        start_sim, tmp_path, {"paths": ["policies/p.yaml"], "reload_interval_s": 0.2}
    )
    rounds = Rounds(gateway.url, tmp_path / "log")
    policy = tmp_path / "policies" / "p.yaml"
    try:
        until(rounds.serving, "both workers serving", timeout=60)
        assert gateway.proc is not None
        pids = worker_pids(gateway.proc.pid)
        stale = pids[0]
        index, sibling = worker_index(stale), worker_index(pids[1])
        limits = resource.prlimit(stale, resource.RLIMIT_NOFILE)
        resource.prlimit(stale, resource.RLIMIT_NOFILE, (0, limits[1]))
        try:
            before = len(gateway.stderr())
            write_policy(policy, "2", "ap")
            until(
                lambda: failed_after_sibling_loaded(gateway.stderr()[before:], index),
                "the sibling loading the narrowed set, then the worker's read failing",
                timeout=60,
                interval=0.02,
            )
            typo = policy.with_suffix(".tmp")
            typo.write_text("kind: [")
            typo.replace(policy)
            until(
                lambda: failed_on_content(gateway.stderr()[before:], sibling),
                "the sibling refusing the invalid file",
                timeout=60,
            )
        finally:
            resource.prlimit(stale, resource.RLIMIT_NOFILE, limits)
        until(
            lambda: failed_on_content(gateway.stderr()[before:], index),
            "the worker reading the invalid file once its limit is back",
            timeout=60,
        )
        headers = {"authorization": f"Bearer {KEY}", "connection": "close"}
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as client:
            statuses = [
                client.post("/v1/chat/completions", json=BODY).status_code for _ in range(ROUND)
            ]
            ready = {client.get("/readyz").status_code for _ in range(ROUND)}
        assert 200 not in statuses, statuses  # before: the stale worker's share, version 1
        assert set(statuses) == {404, 503}, statuses
        assert ready == {200, 503}, ready
        write_policy(policy, "2", "ap")  # the typo fixed: both read it, both refuse 404
        until(rounds.refusing, "both workers refusing under the narrowed set", timeout=60)
    finally:
        gateway.stop(signal.SIGTERM)
    assert_each_log_names_its_set(tmp_path / "log", vkey)
