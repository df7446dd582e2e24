"""What the log commits to is what the client got, on the relay's unhappy paths.

Each test drives a real gateway (provenance on) in front of a scripted raw backend (or a
hosted provider) and opens the completion record's response commitment with the client's
own bytes: a failover (two dispatches, one answer), a client that leaves mid-stream (499),
a stream whose framing breaks or whose deadline passes, a hosted answer, and the error
event that ends a broken stream (an event of its own).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import commit, load_signer
from gateway.provenance.formats.stream_body import committed_bodies
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    logged_gateway,
    logged_private_gateway,
)
from tests.helpers.log_truth import (
    CHAT,
    DONE,
    EVENT,
    ORIGIN,
    first_attempt_fails,
    hosted_gateway,
    salt_of,
    sse_events,
    stream_receipt,
)
from tests.helpers.provenance import completion_record, records, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS  # some of these tests stream from a hosted backend


def test_a_failover_records_both_attempts_and_the_receipt_opens_the_served_one(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    first_fails = first_attempt_fails()
    one, two = start_raw(first_fails), start_raw(first_fails)
    backends = [backend("a", one.url, "m"), backend("b", two.url, "m")]
    gateway = logged_gateway(start_gateway, tmp_path, backends, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200
    seen = response.content.split(b": owngate-receipt ")[0]
    assert seen == EVENT + DONE
    request_id, salt = salt_of(stream_receipt(response.content))
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
    _, salt = salt_of(receipt)
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
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 502
    assert record["response_commitment"] == commit("response", salt, EVENT)


def test_hosted_answers_commit_to_what_the_gateway_encoded_for_the_client(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    hosted = start_sim("vllm", models=("f",), zero_latency=True)
    gateway = hosted_gateway(start_gateway, tmp_path, f"{hosted.url}/v1", "f")
    url = f"{gateway.url}/v1/chat/completions"
    ask = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    whole = httpx.post(url, json=ask, headers=gateway.headers, timeout=60)
    assert whole.status_code == 200, whole.text
    request_id, salt = salt_of(base64.b64decode(whole.headers["x-owngate-receipt"]))
    record = completion_record(tmp_path / "log", request_id)
    assert record["response_commitment"] == commit("response", salt, whole.content)
    streamed = httpx.post(url, json={**ask, "stream": True}, headers=gateway.headers, timeout=60)
    seen = streamed.content.split(b": owngate-receipt ")[0]
    assert seen.endswith(DONE) and b'"usage"' not in seen
    request_id, salt = salt_of(stream_receipt(streamed.content))
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
    gateway = hosted_gateway(start_gateway, tmp_path, f"{raw.url}/v1", "f")
    ask = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    streamed = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=60
    )
    event, error = streamed.content.split(b": owngate-receipt ")[0].split(b"\n\n")[:2]
    assert b'"content":"hi"' in event and b'"upstream_error"' in error
    request_id, salt = salt_of(stream_receipt(streamed.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 502
    assert record["response_commitment"] == commit("response", salt, event + b"\n\n")


@pytest.mark.parametrize(
    "before",
    [
        b'data: {"id":"c","choices":[]}\n',
        b'data: {"id":"c","choices":[]}\r',
        b'data: {"id":"c","cho',
        # a blank line whose last line end is a lone CR (the backend's CRLF cut after
        # its CR, or CR line ends): the event has ended, the gateway adds nothing
        b'data: {"id":"c","choices":[]}\r\n\r',
        b'data: {"id":"c","choices":[]}\r\r',
    ],
    ids=["event-open", "event-open-cr", "line-open", "ended-crlf-cr", "ended-cr-cr"],
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
    events = sse_events(response.content)
    assert events[0] == EVENT.strip()
    assert json.loads(events[-1].removeprefix(b"data: "))["error"]["code"] == "upstream_error"
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 502
    assert record["response_commitment"] == commit("response", salt, EVENT + before)
    # what a client holds is enough: `audit open` takes the gateway's tail off itself
    assert EVENT + before in committed_bodies(response.content)
    # and `audit open --receipt` holds that tail to the record: the gateway's error event
    # on a stream its completion says broke off
    (tmp_path / "received").write_bytes(response.content)
    (tmp_path / "receipt.json").write_bytes(stream_receipt(response.content))
    argv = ["open", str(tmp_path / "received"), "--kind", "response"]
    argv += ["--receipt", str(tmp_path / "receipt.json"), "--log", str(tmp_path / "log")]
    assert run_audit([*argv, "--key", load_signer(tmp_path / "log.key").vkey]) == 0


def test_a_stream_whose_last_line_is_unended_commits_to_the_backends_bytes(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The backend ends its stream (chunked, last chunk sent) inside `data: [DONE]`: the
    gateway writes an LF before its receipt line, and commits to the backend's bytes
    without it, which the client's bytes still open (`committed_bodies`)."""
    relayed = EVENT + b"data: [DONE]"

    async def unended(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(relayed), relayed))
        await writer.drain()
        return False

    raw = start_raw(unended)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    asks_usage = {**CHAT, "stream_options": {"include_usage": True}}  # nothing held back
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=asks_usage, headers=gateway.headers, timeout=30
    )
    assert response.content.startswith(relayed + b"\n: owngate-receipt ")
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert record["status"] == 200
    assert record["response_commitment"] == commit("response", salt, relayed)
    assert relayed in committed_bodies(response.content)


def test_a_stream_past_its_deadline_commits_to_what_came_before_its_504_event(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """`limits.stream_timeout_s` passes while the backend holds its stream open: the
    client gets an `upstream_timeout` event, the record 504 and the bytes before it."""
    released = threading.Event()

    async def holds(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + EVENT)
        await writer.drain()
        await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
        return False

    raw = start_raw(holds)
    gateway = logged_private_gateway(
        start_gateway, tmp_path, raw.url, ORIGIN, limits={"stream_timeout_s": 0.5}
    )
    try:
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
        )
    finally:
        released.set()
    events = sse_events(response.content)
    assert events[0] == EVENT.strip()
    assert json.loads(events[-1].removeprefix(b"data: "))["error"]["code"] == "upstream_timeout"
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (504, "upstream_timeout")
    assert record["response_commitment"] == commit("response", salt, EVENT)
