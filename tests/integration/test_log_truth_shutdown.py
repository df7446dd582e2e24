"""What the log says when uvicorn's forced shutdown (a second signal, or its graceful
timeout: it cancels every request task still running) ends a request while the app is
answering it, say while an error answer's receipt is being signed. The record says 503
cut, so the client gets that 503 (OpenAI's error format), never uvicorn's own plain 500.
(The app's own drain deadline cannot reach an answer being given: the request leaves
`serving` first.)
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.api.trail import Trail
from tests.helpers.gateways import Gateway, logged_private_gateway
from tests.helpers.log_truth import CHAT, ORIGIN, salt_of
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import ERROR_BODY, Answer, RawBackend, json_answer
from tests.helpers.waiting import until

# uvicorn's Server.shutdown, once `timeout_graceful_shutdown` passed (or the loop's end
# after a forced exit, without a message): every request task still running is cancelled.
UVICORN_CUT = "Task cancelled, timeout graceful shutdown exceeded"


def test_an_error_answer_cut_while_its_receipt_is_signed_gets_the_503_its_record_says(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The only backend fails (500): the client is to get the gateway's 502, whose
    receipt is being signed (held here) when uvicorn cancels the request, the gateway
    draining. Before, the cancellation left the app from its error handler: uvicorn sent
    its own plain `500 Internal Server Error` while the completion record said 503 cut."""
    signing, released = threading.Event(), threading.Event()
    sealed = Trail.sealed_receipt

    tasks: list[asyncio.Task[object]] = []

    async def held(trail: Trail) -> bytes | None:
        if not signing.is_set():  # the error's receipt: held; any later one: not
            task = asyncio.current_task()
            assert task is not None
            tasks.append(task)  # the request's, uvicorn's task for its ASGI call
            signing.set()
            await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
        return await sealed(trail)

    monkeypatch.setattr(Trail, "sealed_receipt", held)
    raw = start_raw(json_answer(ERROR_BODY, b"500 Internal Server Error"))
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, ORIGIN, limits={"drain_timeout_s": 30.0}
    )
    with ThreadPoolExecutor(1) as pool:
        try:
            asked = pool.submit(
                httpx.post,
                f"{gateway.url}/v1/chat/completions",
                json={**CHAT, "stream": False},
                headers=gateway.headers,
                timeout=30,
            )
            assert signing.wait(30)
            (task,) = tasks
            loop = task.get_loop()
            loop.call_soon_threadsafe(gateway.app.begin_drain)  # the first signal
            loop.call_soon_threadsafe(lambda: task.cancel(msg=UVICORN_CUT))
            response = asked.result(30)
        finally:
            released.set()
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "not_ready"
    # Signed before the cut (only the wait for it was held): it goes with the 503.
    request_id, _ = salt_of(base64.b64decode(response.headers["x-owngate-receipt"]))
    assert request_id == response.headers["x-request-id"]
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 503
    assert record["response_commitment"] is None


def test_a_request_whose_body_is_still_arriving_at_a_forced_shutdown_gets_a_503(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """uvicorn's forced shutdown cancels a request whose body is still being read: nothing
    was dispatched (no record, no receipt), and the client gets the gateway's 503
    `not_ready`, not uvicorn's plain 500."""
    raw = start_raw(json_answer(ERROR_BODY, b"500 Internal Server Error"))  # never asked
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, ORIGIN, limits={"drain_timeout_s": 30.0}
    )
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {gateway.key}\r\ncontent-length: 1000\r\n\r\n{{"
    ).encode()
    with socket.create_connection((gateway.server.host, gateway.server.port), 10) as client:
        client.sendall(head)  # 1 byte of the 1,000 the body will never get
        until(lambda: len(gateway.app.serving) == 1, "the body being read", timeout=30)
        (task,) = list(gateway.app.serving)
        loop = task.get_loop()
        loop.call_soon_threadsafe(gateway.app.begin_drain)  # the first signal
        loop.call_soon_threadsafe(lambda: task.cancel(msg=UVICORN_CUT))
        client.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            more = client.recv(65536)
            if not more:
                break
            answer += more
    head_part, _, body = answer.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 503 "), answer
    assert b"x-owngate-receipt" not in head_part.lower()
    assert json.loads(body)["error"]["code"] == "not_ready"
    assert not raw.posts  # nothing dispatched
