"""`owngate serve` whose tile directory refuses the checkpoint export while its write-ahead
segment still takes appends (docs/provenance.md, "Failures"): the entries no checkpoint
covers are held in memory up to `provenance.max_unsigned_bytes`, then new requests are
refused 503 `provenance_unavailable` with `retry-after` (no receipt handed out for an entry
the log cannot publish), `/readyz` and `owngate_provenance_unsigned_bytes` say so, and once
the tiles can be written every entry is signed, in order: `owngate audit verify` passes
and every receipt handed out verifies. Before, every request was served and the entries
held grew without bound (some 1.2 to 2 KB of memory per request).

The fault: a file stands where the tiles' directory was (as in
test_provenance_full_disk.py), which refuses every tile, root or not.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson

from gateway.provenance import write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.provenance import run_audit
from tests.helpers.waiting import until

ORIGIN = "test.owngate/log/backlog"
KEY = "og-backlog-test-key-0123456789abc"
BOUND = 100_000  # bytes of unsigned entries: some 90 requests' records
ASK = orjson.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})


def test_serve_bounds_what_it_holds_while_no_checkpoint_can_be_written(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    key = write_signing_key(tmp_path / "log.key", ORIGIN)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": False},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "provenance": {
            "dir": "log",
            "origin": ORIGIN,
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 50,
            "max_unsigned_bytes": BOUND,
        },
    }
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    gateway = GatewayProcess(config, tmp_path)
    receipts: dict[str, bytes] = {}
    tiles, saved = tmp_path / "log" / "tile", tmp_path / "tile.saved"

    def metric(http: httpx.Client, name: str) -> float:
        for line in http.get(f"{gateway.url}/metrics").text.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        raise AssertionError(f"no {name}")

    def ask(http: httpx.Client) -> httpx.Response:
        answer = http.post(f"{gateway.url}/v1/chat/completions", content=ASK)
        if answer.status_code == 200:
            receipts[answer.headers["x-request-id"]] = base64.b64decode(
                answer.headers["x-owngate-receipt"]
            )
        return answer

    try:
        gateway.start()
        with httpx.Client(headers=headers, timeout=30) as http:
            assert ask(http).status_code == 200
            until(lambda: (tiles / "entries").is_dir(), "the first entries exported", timeout=30)
            tiles.rename(saved)
            tiles.write_bytes(b"")  # where the tiles must go, a file: no checkpoint is signed
            for _ in range(1000):  # bounded: ~90 requests fit
                answer = ask(http)
                if answer.status_code != 200:
                    break
            else:
                raise AssertionError("1,000 requests served while no checkpoint was signed")
            served = len(receipts)
            assert 20 < served < 1000
            for _ in range(20):  # refused at the bound, each of them
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["code"] == "provenance_unavailable"
                assert answer.headers["retry-after"] == "1"
                assert "x-owngate-receipt" not in answer.headers
                answer = ask(http)
            assert len(receipts) == served
            assert http.get(f"{gateway.url}/readyz").status_code == 503
            held = metric(http, "owngate_provenance_unsigned_bytes")
            assert BOUND <= held < BOUND + 8192, held  # a request's records past it, at most
            assert metric(http, "owngate_provenance_ready") == 0

            tiles.unlink()
            saved.rename(tiles)  # the disk takes tiles again
            until(
                lambda: http.get(f"{gateway.url}/readyz").status_code == 200,
                "ready again once a checkpoint is signed",
                timeout=30,
            )
            assert metric(http, "owngate_provenance_unsigned_bytes") < BOUND
            assert ask(http).status_code == 200
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
    finally:
        gateway.stop(signal.SIGKILL)
    stderr = gateway.stderr()
    assert stderr.count('"event":"provenance log backlog full"') == 1, stderr[-3000:]
    assert '"event":"provenance log backlog signed again"' in stderr
    log = str(tmp_path / "log")
    assert run_audit(["verify", log, "--key", key]) == 0
    for request_id, receipt in receipts.items():
        path = tmp_path / f"{request_id}.receipt"
        path.write_bytes(receipt)
        assert run_audit(["receipt", "verify", str(path), "--key", key, "--log", log]) == 0
