"""The gateway as its own process: SIGHUP policy reload, and a SIGKILL under load.

These run `owngate serve` in a subprocess (the signal handling and restart recovery
only exist there) against simulators in this process.
"""

from __future__ import annotations

import base64
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.provenance import (
    LogDirectory,
    load_verifiers,
    verify_log,
    verify_receipt,
    write_signing_key,
)
from tests.helpers.gateways import readiness
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.waiting import until

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


def test_sighup_reloads_policies(process: Callable[..., GatewayProcess], tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(POLICY.format(version="1"))
    gateway = process(policy={"paths": ["policies"], "reload_interval_s": 3600}).start()
    before = readiness(gateway.url)["policy"]
    (policies / "p.yaml").write_text(POLICY.format(version="2"))
    assert gateway.proc is not None
    gateway.proc.send_signal(signal.SIGHUP)
    # The file poll (an hour) does not do this: the SIGHUP does.
    until(
        lambda: readiness(gateway.url)["policy"]["digest"] != before["digest"],
        "the new policy digest",
        timeout=10.0,
        interval=0.05,
    )


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
    # the kill must find a stream mid-way: wait for one to receive bytes, not only for the
    # whole answers (on a busy machine the four load threads got 50 before it began)
    until(
        lambda: len(receipts) >= 50 and bool(streamed),
        "50 receipts and a stream receiving bytes",
        timeout=30.0,
    )
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
