"""`owngate serve` shut down by force while requests are in flight: after the drain began
(SIGTERM), a SIGINT starts uvicorn's own shutdown and another one forces it (uvicorn's
`force_exit`: no wait for the requests, which the event loop's end then cancelled, nor
for the app's lifespan shutdown, which closes the provenance log). A client still
waiting gets the 503 its completion record says, in OpenAI's format (a stream: its error
event, its receipt and a proper end), not uvicorn's plain 500 or a stream cut off
unended; the record is written and covered by the final checkpoint, and the log verifies.
Before, the record was lost (the log closed under it, no final checkpoint signed) and the
process exited 0 all the same.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.provenance import commit, load_signer, write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import backend
from tests.helpers.log_truth import CHAT, EVENT, ORIGIN, salt_of, sse_events, stream_receipt
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.provenance import records, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.waiting import until

KEY = "og-forced-test-key-0123456789abcd"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_request_in_flight_at_a_forced_shutdown_gets_the_503_its_record_says(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path, stream: bool
) -> None:
    asked, released = threading.Event(), threading.Event()

    async def held(writer: asyncio.StreamWriter, _post: Post) -> bool:
        if stream:
            writer.write(sse_head() + EVENT)
            await writer.drain()
        asked.set()
        await asyncio.get_running_loop().run_in_executor(None, released.wait, 60)
        return False

    raw = start_raw(held)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": True},
        "limits": {"drain_timeout_s": 60},
        "backends": [backend("gpu", raw.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "provenance": {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"},
    }
    gateway = GatewayProcess(config, tmp_path).start()
    got = bytearray()
    headers = {"authorization": f"Bearer {KEY}"}

    def ask() -> httpx.Response:
        url = f"{gateway.url}/v1/chat/completions"
        with httpx.stream(
            "POST", url, json={**CHAT, "stream": stream}, headers=headers, timeout=90
        ) as r:
            for chunk in r.iter_bytes():
                got.extend(chunk)
            return r

    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(ask)
            assert asked.wait(30)
            if stream:
                until(lambda: bytes(got).startswith(EVENT), "the first event relayed", timeout=30)
            assert gateway.proc is not None
            gateway.proc.send_signal(signal.SIGTERM)
            until(lambda: "draining" in gateway.output(), "the drain began", timeout=30)
            gateway.proc.send_signal(signal.SIGINT)  # uvicorn's shutdown, waiting for it ...
            until(lambda: "Shutting down" in gateway.output(), "uvicorn's shutdown", timeout=30)
            gateway.proc.send_signal(signal.SIGINT)  # ... cut short: force_exit
            response = answer.result(60)
            code = gateway.wait(60)
    finally:
        released.set()
        gateway.stop()
    request_id = response.headers["x-request-id"]
    log = tmp_path / "log"
    mine = [r for r in records(log) if r["request_id"] == request_id]  # the final checkpoint's
    assert [r["type"] for r in mine] == ["dispatch", "completion"], gateway.output()
    assert mine[-1]["status"] == 503, (mine, gateway.output())
    if stream:  # the client got the backend's event, then the gateway's error event
        assert response.status_code == 200
        first, error = sse_events(bytes(got))  # and its receipt line, a comment
        assert first + b"\n\n" == EVENT
        assert json.loads(error.removeprefix(b"data: "))["error"]["code"] == "not_ready"
        _, salt = salt_of(stream_receipt(bytes(got)))  # signed long before: it is there
        assert mine[-1]["response_commitment"] == commit("response", salt, EVENT)
    else:
        assert response.status_code == 503, bytes(got)
        assert json.loads(bytes(got))["error"]["code"] == "not_ready"
        assert mine[-1]["response_commitment"] is None
    assert code == 0
    vkey = load_signer(tmp_path / "log.key").vkey
    assert run_audit(["verify", str(log), "--key", vkey]) == 0
