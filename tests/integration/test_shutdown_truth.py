"""What a shutdown's cut answers once the log holds the request's outcome.

A request cut after its refusal record is in the log gets that refusal. The refusal
record (policy refusal: `unknown_data_class` here, 400) is durable before the client
hears the answer. A cut landing after that, by the app's drain deadline while the record
was being made durable, or by uvicorn's cancellation (its forced shutdown, its graceful
timeout) while the refusal's receipt was awaited, answered 503 `not_ready`: the log said
refused, the client and the access log said 503, and the client even got the refusal's
receipt with the 503 (or none at all, its record in the log all the same).

A request cut after its answer's last message went out (at an await after it: the hosted
relay closes the provider's stream there) got all of its answer: the record and the
access log say so. Before, the record said 503 cut and the cut tried to send on the
finished response (uvicorn raised), while the client had its 200.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.exchange import cancel
from gateway.api.trail import Trail
from gateway.provenance import commit
from gateway.provenance.writer.log import ProvenanceLog
from gateway.upstream.hosted import HostedResponse
from tests.helpers.gateways import LITELLM_WARNINGS, Gateway, Sim, logged_private_gateway
from tests.helpers.hold import Hold
from tests.helpers.log_capture import rendered_logs
from tests.helpers.log_truth import CHAT, DONE, ORIGIN, hosted_gateway, salt_of, stream_receipt
from tests.helpers.provenance import completion_record, records
from tests.helpers.raw_backend import ERROR_BODY, Answer, RawBackend, json_answer
from tests.helpers.waiting import until

UVICORN_CUT = "Task cancelled, timeout graceful shutdown exceeded"  # uvicorn's message


def _refused_gateway(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> Gateway:
    raw = start_raw(json_answer(ERROR_BODY, b"500 Internal Server Error"))  # never asked
    return logged_private_gateway(
        start_gateway, tmp_path, raw.url, ORIGIN, limits={"drain_timeout_s": 60.0}
    )


def _ask(gateway: Gateway) -> Callable[[], httpx.Response]:
    return lambda: httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, "stream": False},
        headers={**gateway.headers, "x-data-class": "bogus"},
        timeout=60,
    )


def _on_loop(task: asyncio.Task[Any], change: Callable[[], None]) -> None:
    """Run `change` on `task`'s loop and return once it ran."""
    done = threading.Event()

    def run() -> None:
        try:
            change()
        finally:
            done.set()

    task.get_loop().call_soon_threadsafe(run)
    assert done.wait(30)


def _assert_refused(response: httpx.Response, log: Path) -> None:
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "unknown_data_class"
    request_id, _ = salt_of(base64.b64decode(response.headers["x-owngate-receipt"]))
    assert request_id == response.headers["x-request-id"]
    until(lambda: any(r["request_id"] == request_id for r in records(log)), "the refusal")
    mine = [r for r in records(log) if r["request_id"] == request_id]
    assert [r["type"] for r in mine] == ["refusal"]
    assert mine[0]["reason"] == "unknown_data_class"


def test_a_drain_deadline_cut_while_the_refusal_is_made_durable_answers_the_refusal(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refusal record is queued, its write held; the app's drain deadline cuts the
    request then (as `_cut_after` does). Before, the cut answered 503 with no receipt
    while the record landed: the log said refused."""
    held = Hold(
        monkeypatch,
        ProvenanceLog,
        "_commit",
        when=lambda _log, batch: any(b'"type":"refusal"' in q.entry for q in batch),
    )
    gateway = _refused_gateway(start_raw, start_gateway, tmp_path)
    app = gateway.app

    def deadline() -> None:
        (task,) = list(app.serving)

        def cut() -> None:
            app.begin_drain()
            app.cutting = True  # the drain deadline passed (`GatewayApp._cut_after`)
            cancel(task)

        _on_loop(task, cut)

    response = held.across(_ask(gateway), deadline)
    _assert_refused(response, tmp_path / "log")


def test_a_forced_cut_while_the_refusals_receipt_is_awaited_answers_the_refusal(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refusal record is durable and its receipt signed; uvicorn cancels the request
    while it waits for that receipt to answer. Before, it got 503 `not_ready` with the
    refusal's receipt."""
    seen: list[tuple[asyncio.Task[Any], Trail]] = []

    def first(trail: Trail) -> bool:
        task = asyncio.current_task()
        assert task is not None
        seen.append((task, trail))
        return True

    held = Hold(monkeypatch, Trail, "sealed_receipt", when=first)
    gateway = _refused_gateway(start_raw, start_gateway, tmp_path)
    app = gateway.app

    def forced() -> None:
        ((task, trail),) = seen
        receipt = trail.receipt
        assert receipt is not None
        until(receipt.done, "the refusal's receipt signed", timeout=30)

        def cut() -> None:
            app.begin_drain()
            task.cancel(msg=UVICORN_CUT)

        _on_loop(task, cut)

    response = held.across(_ask(gateway), forced)
    _assert_refused(response, tmp_path / "log")


@LITELLM_WARNINGS[0]
@LITELLM_WARNINGS[1]
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_cut_after_the_answer_ended_leaves_what_the_client_got(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    """uvicorn cancels the request (the gateway draining) while the hosted relay closes
    the provider's stream, after the client's answer ended."""
    tasks: list[asyncio.Task[Any]] = []

    def first(_response: HostedResponse) -> bool:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        return True

    held = Hold(monkeypatch, HostedResponse, "aclose", when=first)
    hosted = start_sim("vllm", models=("f",), zero_latency=True)
    with rendered_logs() as logs:
        gateway = hosted_gateway(start_gateway, tmp_path, f"{hosted.url}/v1", "f")
        app = gateway.app

        def forced() -> None:
            (task,) = tasks

            def cut() -> None:
                app.begin_drain()
                task.cancel(msg=UVICORN_CUT)

            _on_loop(task, cut)

        ask = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        response = held.across(
            lambda: httpx.post(
                f"{gateway.url}/v1/chat/completions",
                json={**ask, "stream": stream},
                headers=gateway.headers,
                timeout=60,
            ),
            forced,
        )
        assert response.status_code == 200, response.content
        if stream:
            seen = response.content.split(b": owngate-receipt ")[0]
            assert seen.endswith(DONE) and b"not_ready" not in response.content
            request_id, salt = salt_of(stream_receipt(response.content))
        else:
            seen = response.content
            assert response.json()["object"] == "chat.completion"
            request_id, salt = salt_of(base64.b64decode(response.headers["x-owngate-receipt"]))
        record = completion_record(tmp_path / "log", request_id)
        until(lambda: request_id in logs.getvalue(), "the access log line", timeout=30)
    assert record["status"] == 200
    assert record["response_commitment"] == commit("response", salt, seen)
    (line,) = [
        json.loads(line)
        for line in logs.getvalue().splitlines()
        if request_id in line and '"request"' in line
    ]
    assert line["status"] == 200
