"""What the log says of a request that ends between two attempts: the first backend
failed before the client saw a byte, and the client leaves (or the drain deadline cuts
the request) while the next one is still being connected, before its dispatch record.

The failed attempt's completion is then the request's last record, so it must hold what
the client got: 499 for a client that left (it got nothing), 503 for the drain's cut
(the client got 503 `not_ready`), not the status the first backend's failure would have
answered had it been the last attempt.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.exchange import Exchange
from gateway.api.passthrough import PrivateRelay
from gateway.routing.router import Attempt
from gateway.upstream.http import Connection
from tests.helpers.audit_rig import (
    first_request_settled,
    logged,
    request_log,
    settled,
    whole_answer,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.log_truth import CHAT
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.raw_socket import connect
from tests.helpers.waiting import until

_FAILS = whole_answer(500, b'{"error":{"message":"down"}}', b"content-type: application/json")
WHOLE = {**CHAT, "stream": False}


def _second_connect_held(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The second attempt's connect hangs (a backend slow to accept, a TLS handshake that
    stalls) until the request is cancelled (bounded at 30 s); the event is set once it
    began. The first attempt connects as usual."""
    connecting = threading.Event()
    real = PrivateRelay.connect
    seen: list[str] = []

    async def connect(self: PrivateRelay, exchange: Exchange, attempt: Attempt) -> Connection:
        seen.append(attempt.backend.id)
        if len(seen) == 2:
            connecting.set()
            async with asyncio.timeout(30):
                await asyncio.Event().wait()
        return await real(self, exchange, attempt)

    monkeypatch.setattr(PrivateRelay, "connect", connect)
    return connecting


def _gateway(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    **extra: Any,
) -> tuple[Gateway, str]:
    """Two backends serving `m`, each answering 500 (only the first one asked gets to)."""
    backends = [backend(n, start_raw(writes(_FAILS)).url, "m") for n in ("a", "b")]
    return logged(start_gateway, tmp_path, backends, **extra)


def test_a_client_that_leaves_between_attempts_is_recorded_as_gone(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connecting = _second_connect_held(monkeypatch)
    gateway, vkey = _gateway(start_raw, start_gateway, tmp_path)
    body = json.dumps(WHOLE).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n"
        % (gateway.key.encode(), len(body))
    )
    client = connect(gateway.server)
    try:
        client.sendall(head + body)
        assert connecting.wait(30)
    finally:
        client.close()  # gone while the second backend is being connected
    logdir = tmp_path / "log"

    def ended() -> bool:  # the request is over and its first record signed
        return not gateway.app.serving and (logdir / "checkpoint").exists()

    until(ended, "the request ended", timeout=30)
    mine = request_log(logdir, vkey, first_request_settled(logdir, vkey))
    assert [r["type"] for r in mine] == ["dispatch", "completion"]
    assert mine[-1]["status"] == 499, mine[-1]
    assert mine[-1]["response_commitment"] is None


def test_a_drain_cut_between_attempts_is_recorded_with_the_503_the_client_got(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connecting = _second_connect_held(monkeypatch)
    gateway, vkey = _gateway(start_raw, start_gateway, tmp_path, limits={"drain_timeout_s": 0.001})
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(
            httpx.post,
            f"{gateway.url}/v1/chat/completions",
            json=WHOLE,
            headers=gateway.headers,
            timeout=30,
        )
        assert connecting.wait(30)
        (task,) = list(gateway.app.serving)  # the request: its loop is the server's
        task.get_loop().call_soon_threadsafe(gateway.app.begin_drain)
        response = asked.result(30)
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "not_ready"
    rid = response.headers["x-request-id"]
    settled(tmp_path / "log", vkey, rid)
    mine = request_log(tmp_path / "log", vkey, rid)
    assert [r["type"] for r in mine] == ["dispatch", "completion"]
    assert mine[-1]["status"] == 503, mine[-1]
    assert mine[-1]["error"] is not None
