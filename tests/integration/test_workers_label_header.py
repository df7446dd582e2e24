"""`serve --workers 2`: a worker the supervisor restarts after a refused change of
`data_class_header` reads labels from the header its siblings read, never the new one.

The PolicySet names `x-sensitivity`; class `phi` admits no backend (403). The header is
edited to `x-data-class`: both workers refuse that reload (only a restart changes it).
Then one worker dies and the supervisor starts it again: it read the files afresh and
compiled the new header, so a request labelled `x-sensitivity: phi` it took was
unlabelled there and served (200), while its sibling refused it (403). Now the restarted
worker serves no set naming another header than the one pinned for the server's life
(gateway/label_header.py): it refuses (503, loud in its log) until the files name that
header again, and then decides as its sibling does. Requests go on new connections, in
rounds (the kernel spreads them over the workers), bounded in count and time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess, worker_pids
from tests.helpers.reload_files import LABEL_SET
from tests.helpers.waiting import until

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
  data_classes:
    phi:
      description: patient data, on no backend here
      backends: {deny: ["*"]}
"""
BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
ROUND = 16  # requests on new connections: both workers take some, whatever the kernel


def write_set(policies: Path, header: str) -> None:
    temporary = policies / "set.tmp"
    temporary.write_text(LABEL_SET.replace("HEADER", header))
    temporary.replace(policies / "set.yaml")  # atomic, as a deploy tool writes it


def labelled_round(url: str) -> list[int]:
    headers = {"authorization": f"Bearer {KEY}", "connection": "close", "x-sensitivity": "phi"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        return [client.post("/v1/chat/completions", json=BODY).status_code for _ in range(ROUND)]


def logged(stderr: str, event: str) -> set[int]:
    """The workers that logged a whole line whose event contains `event`."""
    entries = [json.loads(line) for line in stderr.split("\n")[:-1] if line.startswith("{")]
    return {e["worker"] for e in entries if event in e.get("event", "") and "worker" in e}


def test_a_restarted_worker_reads_labels_from_its_siblings_header(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    policies = tmp_path / "policies"
    policies.mkdir()
    write_set(policies, "x-sensitivity")
    (policies / "p.yaml").write_text(POLICY)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": False},
        "limits": {"drain_timeout_s": 10},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "policy": {"paths": ["policies"], "reload_interval_s": 0.2},
    }
    gateway = GatewayProcess(config, tmp_path, "--workers", "2")
    aged = time.time_ns() - 60 * 10**9  # no first look reads them again: nothing to settle
    for written in (gateway.path, policies / "set.yaml", policies / "p.yaml"):
        os.utime(written, ns=(aged, aged))
    gateway.start()
    rounds = 0

    def labelled() -> set[int]:
        """A round's answers. Never a 200: `phi` admits no backend, under the header every
        worker must read."""
        nonlocal rounds
        rounds += 1
        assert rounds <= 120, "rounds of requests never showed what was awaited"
        answers = labelled_round(gateway.url)
        assert 200 not in answers, f"a request labelled phi was served: {answers}"
        return set(answers)

    try:
        assert gateway.proc is not None
        supervisor = gateway.proc.pid
        until(lambda: len(worker_pids(supervisor)) == 2, "two workers", timeout=30)
        until(lambda: labelled() == {403}, "both workers refusing phi", timeout=60)
        write_set(policies, "x-data-class")
        until(
            lambda: logged(gateway.stderr(), "policy reload failed") == {1, 2},
            "both workers refusing the new header",
            timeout=60,
        )
        killed = worker_pids(supervisor)[-1]
        os.kill(killed, signal.SIGKILL)
        until(
            lambda: killed not in (pids := worker_pids(supervisor)) and len(pids) == 2,
            "the supervisor restarting the worker",
            timeout=30,
        )
        # The restarted worker refuses (503) while its files name another header; before,
        # it served what its sibling refuses (the assertion in `labelled`).
        until(lambda: 503 in labelled(), "the restarted worker refusing", timeout=60)
        assert logged(gateway.stderr(), "another label header"), "not said in its log"
        write_set(policies, "x-sensitivity")  # the edit reverted: it serves again
        until(lambda: labelled() == {403}, "both workers refusing phi again", timeout=60)
    finally:
        gateway.stop(signal.SIGTERM)
