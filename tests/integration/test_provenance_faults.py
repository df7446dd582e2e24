"""Faults in the provenance log during live requests: no request is answered whose
dispatch record the log lost, and the fault shows (503 `provenance_unavailable`,
`/readyz`, `owngate_provenance_ready`, one log line).

- The log directory deleted under a running gateway: the open write-ahead segment still
  takes writes (in no file anyone will read), so the gateway must refuse, not answer 200.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.api import GatewayApp
from gateway.app import create_app
from gateway.provenance import write_signing_key
from gateway.serving import ServerThread
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config

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
