"""What the log says when the gateway ends a request itself: the drain deadline cutting a
stream or a whole answer, a client leaving before its answer went out, a fault of the
gateway's own. The record's status and commitment are what the client got.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.api.exchange import Exchange, watch_disconnect
from gateway.api.trail import Trail
from gateway.asgi import Receive
from gateway.provenance import commit, load_signer
from gateway.provenance.formats.receipts import countersignature_of
from gateway.provenance.writer import segment_writer
from tests.helpers.attest import start_sidecar
from tests.helpers.gateways import (
    Gateway,
    backend,
    logged_gateway,
    logged_private_gateway,
)
from tests.helpers.log_truth import (
    CHAT,
    EVENT,
    ORIGIN,
    records_when_one,
    salt_of,
    stream_receipt,
)
from tests.helpers.provenance import completion_record, records, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer, sse_head
from tests.helpers.waiting import until


def test_a_stream_cut_by_the_drain_deadline_mid_line_gets_its_error_on_a_line_of_its_own(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The drain deadline cuts a stream whose relayed bytes end mid-line: the error event
    starts a line of its own (glued to the backend's partial line, no client would read
    it), as when the backend breaks off; the record commits to the backend's bytes."""
    partial = b'data: {"id":"c","cho'
    released = threading.Event()
    asks_usage = {**CHAT, "stream_options": {"include_usage": True}}  # nothing held back

    async def unfinished(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + EVENT + partial)
        await writer.drain()
        await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
        return False

    raw = start_raw(unfinished)
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, ORIGIN, limits={"drain_timeout_s": 0.001}
    )
    got = b""
    url = f"{gateway.url}/v1/chat/completions"
    try:
        with httpx.stream("POST", url, json=asks_usage, headers=gateway.headers, timeout=30) as r:
            chunks = r.iter_bytes()
            while not got.endswith(partial):
                got += next(chunks)
            (task,) = list(gateway.app.serving)  # the request: its loop is the server's
            task.get_loop().call_soon_threadsafe(gateway.app.begin_drain)
            got += b"".join(chunks)
    finally:
        released.set()
    assert got.startswith(EVENT + partial + b"\n\ndata: {"), got
    assert b'"not_ready"' in got
    request_id, salt = salt_of(stream_receipt(got))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 503
    assert record["response_commitment"] == commit("response", salt, EVENT + partial)
    # `audit open --receipt` takes the cut's error event off: `not_ready` is a 503, as
    # the record says (a code of another status does not open)
    (tmp_path / "received").write_bytes(got)
    (tmp_path / "receipt.json").write_bytes(stream_receipt(got))
    argv = [
        "open",
        str(tmp_path / "received"),
        "--kind",
        "response",
        "--log",
        str(tmp_path / "log"),
    ]
    argv += ["--receipt", str(tmp_path / "receipt.json")]
    assert run_audit([*argv, "--key", load_signer(tmp_path / "log.key").vkey]) == 0
    (tmp_path / "received").write_bytes(got.replace(b'"not_ready"', b'"upstream_error"'))
    assert run_audit([*argv, "--key", load_signer(tmp_path / "log.key").vkey]) == 1


@pytest.mark.parametrize("attested", [False, True], ids=["plain", "attested"])
def test_a_whole_answer_cut_before_it_went_out_is_not_recorded_as_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    attested: bool,
) -> None:
    """The drain deadline cuts a whole answer while its receipt is still being signed
    (held here until the cut): nothing of the answer went out, so the client gets the
    503 (with its receipt) and the record commits to nothing, not to the answer; nor does
    it, or the receipt, carry an attested backend's countersignature of that answer."""
    answer = b'{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    signing, cut, released = threading.Event(), threading.Event(), threading.Event()
    sealed = Trail.sealed_receipt

    async def held(trail: Trail) -> bytes | None:
        # The answer's (the first with the whole answer fed): held; the 503's (after the
        # cut): not. `cut`: the drain deadline's cancellation landed in this wait.
        if trail.whole == answer and not signing.is_set():
            signing.set()
            try:
                await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
            except asyncio.CancelledError:
                cut.set()
                raise
        return await sealed(trail)

    monkeypatch.setattr(Trail, "sealed_receipt", held)

    whole = json_answer(answer)

    raw = start_raw(whole)
    sidecar = start_sidecar(tmp_path / "sidecar", "gpu-a", raw.url) if attested else None
    try:
        if sidecar is None:
            served = backend("gpu", raw.url, "m")
        else:
            served = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway = logged_gateway(
            start_gateway, tmp_path, [served], ORIGIN, limits={"drain_timeout_s": 0.001}
        )
        url = f"{gateway.url}/v1/chat/completions"
        with ThreadPoolExecutor(1) as pool:
            try:
                asked = pool.submit(
                    httpx.post,
                    url,
                    json={**CHAT, "stream": False},
                    headers=gateway.headers,
                    timeout=30,
                )
                assert signing.wait(30)
                (task,) = list(gateway.app.serving)  # the request: its loop is the server's
                task.get_loop().call_soon_threadsafe(gateway.app.begin_drain)
                response = asked.result(30)
            finally:
                released.set()
    finally:
        if sidecar is not None:
            sidecar.stop()
    assert cut.is_set(), "the cut landed elsewhere than in the held signing"
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "not_ready"
    receipt = base64.b64decode(response.headers["x-owngate-receipt"])
    assert countersignature_of(receipt) is None
    request_id, _ = salt_of(receipt)
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 503
    assert record["response_commitment"] is None
    assert record.get("attestation") is None
    key, log = load_signer(tmp_path / "log.key").vkey, str(tmp_path / "log")
    backend_keys = [] if sidecar is None else ["--backend-key", f"gpu={sidecar.vkey}"]
    assert run_audit(["verify", log, "--key", key, *backend_keys]) == 0


def test_a_whole_answer_whose_client_left_before_it_went_out_is_not_recorded_as_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client leaves while its answer's receipt is being signed: it got nothing, and
    the 499 record commits to nothing."""
    signing, released = threading.Event(), threading.Event()
    sealed = Trail.sealed_receipt

    async def held(trail: Trail) -> bytes | None:
        signing.set()
        await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
        return await sealed(trail)

    monkeypatch.setattr(Trail, "sealed_receipt", held)

    answer = b'{"id":"c","choices":[]}'
    whole = json_answer(answer)

    raw = start_raw(whole)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    body = json.dumps({**CHAT, "stream": False}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {gateway.key}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    try:
        with socket.create_connection((gateway.server.host, gateway.server.port), 10) as client:
            client.sendall(head + body)
            assert signing.wait(30)
        until(lambda: not gateway.app.serving, "the request ended")
    finally:
        released.set()
    (record,) = [r for r in records_when_one(tmp_path / "log") if r["type"] == "completion"]
    assert record["status"] == 499
    assert record["response_commitment"] is None


def _faulty_answer(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> httpx.Response:
    """A gateway bug in the relay (translating the backend's 404 raises): the answer."""

    def faulty(*_args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("gateway.api.passthrough.translate_upstream_error", faulty)

    async def not_found(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        return False

    raw = start_raw(not_found)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, "stream": False},
        headers=gateway.headers,
        timeout=30,
    )
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    return response


def test_an_attempt_that_hits_a_gateway_fault_is_recorded_with_the_500_the_client_got(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unexpected error in the relay (a gateway bug): the client gets 500
    internal_error with its receipt, and so says the record (it said status 0, which no
    client ever gets)."""
    response = _faulty_answer(start_raw, start_gateway, tmp_path, monkeypatch)
    request_id, _ = salt_of(base64.b64decode(response.headers["x-owngate-receipt"]))
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (500, "internal_error")
    assert record["response_commitment"] is None


def test_a_fault_in_giving_the_receipt_still_answers_an_openai_500(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last-resort 500 fetches the receipt; should that fail too (the fault is in what
    gives it), the client still gets the OpenAI error object, without a receipt, not the
    server's plain-text 500."""

    async def no_receipt(*_args: object) -> bytes:
        raise RuntimeError("another bug")

    monkeypatch.setattr("gateway.api.trail.Trail.sealed_receipt", no_receipt)
    response = _faulty_answer(start_raw, start_gateway, tmp_path, monkeypatch)
    assert "x-owngate-receipt" not in response.headers


class _HeldDisk:
    """`os` for the write-ahead segment: once `holding` is set, the next write waits for
    `released` (in the log's worker thread: the event loop runs on)."""

    def __init__(self) -> None:
        self.holding, self.writing, self.released = (threading.Event() for _ in range(3))

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if self.holding.is_set() and not self.writing.is_set():
            self.writing.set()
            self.released.wait(30)
        return os.pwrite(fd, data, offset)


def test_a_client_that_leaves_while_its_dispatch_is_written_gets_a_completion_record(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client leaves while its dispatch record is being made durable: the write
    lands all the same, so the log holds the dispatch, and it must hold its completion
    too (499, nothing sent), not a dispatch left open for ever."""
    disk = _HeldDisk()
    monkeypatch.setattr(segment_writer, "os", disk)
    watched_exchanges: list[Exchange] = []

    def watched(receive: Receive, exchange: Exchange) -> Callable[[], object]:
        watched_exchanges.append(exchange)
        return watch_disconnect(receive, exchange)

    def noticed() -> bool:  # the gateway saw the client leave
        return any(exchange.client_gone for exchange in watched_exchanges)

    monkeypatch.setattr("gateway.api.proxy.watch_disconnect", watched)
    raw = start_raw(json_answer(b'{"id":"c","choices":[]}'))
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    body = json.dumps({**CHAT, "stream": False}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {gateway.key}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    disk.holding.set()
    try:
        with socket.create_connection((gateway.server.host, gateway.server.port), 10) as client:
            client.sendall(head + body)
            assert disk.writing.wait(30)  # the dispatch record is being written
        until(noticed, "the gateway saw the client leave", timeout=30)
    finally:
        disk.released.set()
    until(lambda: not gateway.app.serving, "the request ended")
    gateway.server.stop()  # the final checkpoint
    found = records(tmp_path / "log")
    assert [r["type"] for r in found] == ["dispatch", "completion"]
    assert found[1]["status"] == 499
    assert found[1]["response_commitment"] is None
    assert raw.posts == []  # the backend was never asked
    key = load_signer(tmp_path / "log.key").vkey
    assert run_audit(["verify", str(tmp_path / "log"), "--key", key]) == 0
