"""What the log commits to is what the client got, on the relay's unhappy paths.

Each test drives a real gateway (provenance on) in front of a scripted raw backend and
opens the completion record's response commitment with the client's own bytes: a
failover (two dispatches, one answer), a client that leaves mid-stream (499), a stream
whose chunked framing breaks, and a stream cut by the drain deadline mid-line.
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
from typing import Any

import httpx
import pytest

from gateway.api.trail import Trail
from gateway.provenance import commit, load_signer, write_signing_key
from gateway.provenance.formats.receipts import countersignature_of
from tests.helpers.attest import start_sidecar
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    logged_gateway,
    logged_private_gateway,
)
from tests.helpers.provenance import completion_record, records, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.waiting import until

ORIGIN = "test.owngate/log-truth"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
EVENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def _salt(receipt: bytes) -> tuple[str, bytes]:
    """The request id and response salt a receipt carries."""
    payload = json.loads(base64.b64decode(json.loads(receipt)["payload"]))
    return payload["request_id"], bytes.fromhex(payload["salts"]["response"])


def _stream_receipt(body: bytes) -> bytes:
    line = body.rsplit(b"\n: owngate-receipt ", 1)[1]
    return base64.b64decode(line.removesuffix(b"\n\n"))


def test_a_failover_records_both_attempts_and_the_receipt_opens_the_served_one(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    posts: list[int] = []

    async def first_fails(writer: asyncio.StreamWriter, _post: Post) -> bool:
        posts.append(1)
        if len(posts) == 1:
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        else:
            writer.write(sse_head() + EVENT + DONE)
        await writer.drain()
        return False

    one, two = start_raw(first_fails), start_raw(first_fails)
    backends = [backend("a", one.url, "m"), backend("b", two.url, "m")]
    gateway = logged_gateway(start_gateway, tmp_path, backends, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200
    seen = response.content.split(b": owngate-receipt ")[0]
    assert seen == EVENT + DONE
    request_id, salt = _salt(_stream_receipt(response.content))
    assert request_id == response.headers["x-request-id"]
    found: list[dict[str, Any]] = []

    def both_covered() -> bool:  # a checkpoint may cover the first attempt's alone
        found[:] = [r for r in records(tmp_path / "log") if r["request_id"] == request_id]
        return [r["type"] for r in found].count("completion") == 2

    until(both_covered, "both completion records signed")
    kinds = [r["type"] for r in found]
    assert kinds == ["dispatch", "completion", "dispatch", "completion"], kinds
    failed, served = found[1], found[3]
    assert failed["status"] == 503 and failed["response_commitment"] is None
    assert served["status"] == 200
    assert served["response_commitment"] == commit("response", salt, seen)
    assert found[0]["backend"]["id"] != found[2]["backend"]["id"]


def test_a_client_that_leaves_mid_stream_is_recorded_with_what_it_was_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    left = threading.Event()

    async def hangs(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + EVENT)
        await writer.drain()
        await asyncio.get_running_loop().run_in_executor(None, left.wait, 30)
        return False

    raw = start_raw(hangs)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    body = json.dumps(CHAT).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {gateway.key}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((gateway.server.host, gateway.server.port), 10) as client:
        client.sendall(head + body)
        got = b""
        while EVENT not in got:
            got += client.recv(65536)
    left.set()
    request_id = got.split(b"x-request-id: ")[1].split(b"\r\n")[0].decode()
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 499
    receipt = httpx.get(
        f"{gateway.url}/v1/provenance/receipts/{request_id}", headers=gateway.headers, timeout=10
    ).content
    _, salt = _salt(receipt)
    assert record["response_commitment"] == commit("response", salt, EVENT)


def test_a_stream_whose_chunked_framing_breaks_commits_to_what_came_before(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    async def broken(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        writer.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT) + b"zz-not-a-size\r\n")
        await writer.drain()
        return False

    raw = start_raw(broken)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.content.startswith(EVENT + b"data: {")
    request_id, salt = _salt(_stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 502
    assert record["response_commitment"] == commit("response", salt, EVENT)


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
    request_id, salt = _salt(_stream_receipt(got))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 503
    assert record["response_commitment"] == commit("response", salt, EVENT + partial)


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
    signing, released = threading.Event(), threading.Event()
    sealed = Trail.sealed_receipt

    async def held(trail: Trail) -> bytes | None:
        if not signing.is_set():  # the answer's: held; the 503's (after the cut): not
            signing.set()
            await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
        return await sealed(trail)

    monkeypatch.setattr(Trail, "sealed_receipt", held)

    async def whole(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(answer) + answer)
        await writer.drain()
        return False

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
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "not_ready"
    receipt = base64.b64decode(response.headers["x-owngate-receipt"])
    assert countersignature_of(receipt) is None
    request_id, _ = _salt(receipt)
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

    async def whole(writer: asyncio.StreamWriter, _post: Post) -> bool:
        answer = b'{"id":"c","choices":[]}'
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(answer) + answer)
        await writer.drain()
        return False

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


def records_when_one(log: Path) -> list[dict[str, Any]]:
    """The log's records once a checkpoint covers a completion."""
    until(lambda: any(r["type"] == "completion" for r in records(log)), "a completion")
    return records(log)


def _hosted_gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, url: str, model: str
) -> Gateway:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    return start_gateway(
        [hosted_backend("hosted", url, model)],
        environ={"HOSTED_KEY": "sk-test"},
        policy={"paths": [str(tmp_path / "policies")]},
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": ORIGIN,
            "signing_key_file": str(tmp_path / "log.key"),
            "checkpoint_interval_ms": 20,
        },
    )


def test_hosted_answers_commit_to_what_the_gateway_encoded_for_the_client(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    hosted = start_sim("vllm", models=("f",), zero_latency=True)
    gateway = _hosted_gateway(start_gateway, tmp_path, f"{hosted.url}/v1", "f")
    url = f"{gateway.url}/v1/chat/completions"
    ask = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    whole = httpx.post(url, json=ask, headers=gateway.headers, timeout=60)
    assert whole.status_code == 200, whole.text
    request_id, salt = _salt(base64.b64decode(whole.headers["x-owngate-receipt"]))
    record = completion_record(tmp_path / "log", request_id)
    assert record["response_commitment"] == commit("response", salt, whole.content)
    streamed = httpx.post(url, json={**ask, "stream": True}, headers=gateway.headers, timeout=60)
    seen = streamed.content.split(b": owngate-receipt ")[0]
    assert seen.endswith(DONE) and b'"usage"' not in seen
    request_id, salt = _salt(_stream_receipt(streamed.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 200 and record["usage"] is not None  # reported, held back
    assert record["response_commitment"] == commit("response", salt, seen)


def test_a_hosted_stream_the_provider_breaks_off_commits_to_what_came_before(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The provider's chunked stream breaks off (no last chunk) after one event: the
    client gets that event and an error event, and the record (502) commits to the
    event alone."""
    chunk = b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"f",'
    chunk += b'"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"}}]}\n\n'

    async def cut(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        return False

    raw = start_raw(cut)
    gateway = _hosted_gateway(start_gateway, tmp_path, f"{raw.url}/v1", "f")
    ask = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    streamed = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=60
    )
    event, error = streamed.content.split(b": owngate-receipt ")[0].split(b"\n\n")[:2]
    assert b'"content":"hi"' in event and b'"upstream_error"' in error
    request_id, salt = _salt(_stream_receipt(streamed.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 502
    assert record["response_commitment"] == commit("response", salt, event + b"\n\n")


def test_a_stream_answering_a_whole_request_cut_by_the_drain_deadline_ends_with_its_error(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """A backend streams its answer to a request that did not ask for a stream (relayed
    as the stream it is). Cut by the drain deadline, the client gets what any cut stream
    gets: the error event and its receipt, as the record (503) says."""
    released = threading.Event()

    async def streams(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + EVENT)
        await writer.drain()
        await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
        return False

    raw = start_raw(streams)
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, ORIGIN, limits={"drain_timeout_s": 0.001}
    )
    got = b""
    url = f"{gateway.url}/v1/chat/completions"
    whole = {**CHAT, "stream": False}
    try:
        with httpx.stream("POST", url, json=whole, headers=gateway.headers, timeout=30) as r:
            chunks = r.iter_bytes()
            while not got.endswith(EVENT):
                got += next(chunks)
            (task,) = list(gateway.app.serving)  # the request: its loop is the server's
            task.get_loop().call_soon_threadsafe(gateway.app.begin_drain)
            got += b"".join(chunks)
    finally:
        released.set()
    assert got.startswith(EVENT + b"data: {"), got
    assert b'"not_ready"' in got
    request_id, salt = _salt(_stream_receipt(got))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 503
    assert record["response_commitment"] == commit("response", salt, EVENT)


def test_an_attempt_that_hits_a_gateway_fault_is_recorded_with_the_500_the_client_got(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unexpected error in the relay (a gateway bug: here, translating the backend's
    error raises): the client gets 500 internal_error with its receipt, and so says the
    record (it said status 0, which no client ever gets)."""

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
    request_id, _ = _salt(base64.b64decode(response.headers["x-owngate-receipt"]))
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (500, "internal_error")
    assert record["response_commitment"] is None


def _events(body: bytes) -> list[bytes]:
    """The events an SSE parser dispatches (their lines joined), comments left out."""
    events = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [line for line in block.split(b"\n") if line and not line.startswith(b":")]
        if lines:
            events.append(b"\n".join(lines))
    return events


@pytest.mark.parametrize(
    "before",
    [b'data: {"id":"c","choices":[]}\n', b'data: {"id":"c","cho'],
    ids=["event-open", "line-open"],
)
def test_the_error_event_ending_a_broken_stream_is_an_event_of_its_own(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    before: bytes,
) -> None:
    """The backend dies inside an event (its last line ended, or not): the gateway's
    error event must not join that event, or an SSE client reads one broken event and
    never the error the record (502) says the stream ended with."""

    async def dies(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + EVENT + before)
        await writer.drain()
        return False

    raw = start_raw(dies)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    asks_usage = {**CHAT, "stream_options": {"include_usage": True}}  # nothing held back
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=asks_usage, headers=gateway.headers, timeout=30
    )
    events = _events(response.content)
    assert events[0] == EVENT.strip()
    assert json.loads(events[-1].removeprefix(b"data: "))["error"]["code"] == "upstream_error"
    request_id, salt = _salt(_stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 502
    assert record["response_commitment"] == commit("response", salt, EVENT + before)
