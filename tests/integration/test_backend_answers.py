"""What a private backend sends back is bounded and relayed exactly, over real sockets.

A backend is trusted to serve, not to be well-behaved: an answer past
`limits.max_response_bytes` is a 502 and the gateway stops reading at once; one that
drips past `limits.response_timeout_s` is a 504; bytes after a complete response never
reach a client; a stream whose body ends with the connection is complete only with its
`data: [DONE]`, else it ends with an error event and is recorded as failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    logged_private_gateway,
)
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)
MIB = 1024 * 1024
ORIGIN = "test.owngate/answers"


def post(gateway: Gateway, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, **extra},
        headers=gateway.headers,
        timeout=60,
    )


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
def test_an_answer_over_the_limit_is_502_and_reading_stops(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    announced: bool,
) -> None:
    total = 32 * MIB
    written = [0]

    async def huge(writer: asyncio.StreamWriter, _post: Post) -> bool:
        framing = b"content-length: %d" % total if announced else b"transfer-encoding: chunked"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%s\r\n\r\n" % framing)
        piece = b"x" * MIB
        for _ in range(total // MIB):
            writer.write(piece if announced else b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            written[0] += len(piece)
        return False

    raw = start_raw(huge)
    gateway = start_gateway([backend("gpu", raw.url, "m")], limits={"max_response_bytes": MIB})
    response = post(gateway)
    assert response.status_code == 502
    assert error_code(response) == "upstream_error"
    assert "max_response_bytes" in response.json()["error"]["message"]
    assert raw.finished.wait(30)
    # The gateway dropped the connection as soon as the limit was passed: the backend
    # could write the limit plus what socket buffers hold, far from the whole answer.
    assert written[0] <= 8 * MIB
    if announced:
        assert written[0] <= 2 * MIB  # refused on the header, before reading the body


def test_a_dripping_answer_is_504_at_the_response_deadline(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    length = 1500  # one byte per 20 ms: 30 s for the whole body
    written = [0]

    async def drip(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % length)
        for _ in range(length):
            await writer.drain()
            writer.write(b" ")
            written[0] += 1
            await asyncio.sleep(0.02)  # the fault itself: a body that keeps trickling in
        return False

    raw = start_raw(drip)
    gateway = start_gateway(
        [backend("gpu", raw.url, "m")],
        limits={"response_timeout_s": 1.0, "read_timeout_s": 5.0, "first_byte_timeout_s": 5.0},
    )
    response = post(gateway)
    assert response.status_code == 504
    assert error_code(response) == "upstream_timeout"
    assert raw.finished.wait(30)
    assert written[0] < length  # the gateway hung up: the backend stopped mid-body


@pytest.mark.parametrize(
    "extra",
    [b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nSMUGGLED!", b"garbage after the answer\r\n"],
    ids=["second-response", "garbage"],
)
def test_bytes_after_a_complete_answer_never_reach_a_client(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    extra: bytes,
) -> None:
    async def answer_twice(writer: asyncio.StreamWriter, post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(ANSWER) + ANSWER + extra)
        await writer.drain()
        return True  # a request that still came on this connection gets another answer

    raw = start_raw(answer_twice)
    gateway = start_gateway([backend("gpu", raw.url, "m")])
    for _ in range(2):
        response = post(gateway)
        assert response.status_code == 200
        assert response.content == ANSWER
    # The connection that carried the extra bytes was dropped, never reused.
    assert len({p.connection for p in raw.posts}) == 2


CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'  # noqa: E501


USAGE_CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
)


@pytest.mark.parametrize("ending", [b"\r", b"\r\n", b"\n"], ids=["CR", "CRLF", "LF"])
@pytest.mark.parametrize("asked", [False, True], ids=["usage-held-back", "usage-asked"])
def test_a_stream_ended_by_done_and_the_close_is_whole_whatever_its_line_ends(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    ending: bytes,
    asked: bool,
) -> None:
    # A CR-only stream (valid SSE) ending `data: [DONE]\r\r` and the close used to be
    # taken for a backend that died: an error event after its [DONE], 502 recorded, the
    # breaker charged; and its usage chunk reached a client that had not asked for it.
    body = (CHUNK + USAGE_CHUNK + b"data: [DONE]\n\n").replace(b"\n", ending)

    async def stream_then_close(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head() + body)
        await writer.drain()
        return False  # the close ends the body (no framing)

    raw = start_raw(stream_then_close)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    options = {"stream_options": {"include_usage": True}} if asked else {}
    response = post(gateway, stream=True, **options)
    assert response.status_code == 200
    shown = body if asked else (CHUNK + b"data: [DONE]\n\n").replace(b"\n", ending)
    # then only the receipt line (the record's commitment covers `shown`)
    assert response.content.startswith(shown + b": owngate-receipt "), response.content[:400]
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert (record["status"], record["error"]) == (200, None)
    assert record["usage"] is not None and record["usage"]["total_tokens"] == 5
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=60).text
    assert "owngate_requests_total{" in metrics
    assert "owngate_upstream_errors_total{" not in metrics  # no failure charged to it


@pytest.mark.parametrize(
    ("framing", "body", "cut"),
    [
        (b"connection: close\r\n", CHUNK * 2, True),
        (b"connection: close\r\n", CHUNK * 2 + b"data: [DONE]\n\n", False),
        (b"transfer-encoding: chunked\r\n", b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK), True),
    ],
    ids=["close-delimited-cut", "close-delimited-whole", "chunked-cut"],
)
def test_a_stream_cut_by_the_backend_ends_with_an_error_and_is_recorded_failed(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    framing: bytes,
    body: bytes,
    cut: bool,
) -> None:
    async def stream_then_die(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head(framing) + body)
        await writer.drain()
        return False  # the backend closes the connection

    raw = start_raw(stream_then_die)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = post(gateway, stream=True)
    assert response.status_code == 200  # the headers went out with the first chunk
    events = [e for e in response.text.split("\n\n") if e and not e.startswith(":")]
    assert events[0] + "\n\n" == CHUNK.decode()
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    if cut:
        assert events[-1].startswith("data: {")
        assert orjson.loads(events[-1][6:])["error"]["code"] == "upstream_error"
        assert "[DONE]" not in response.text
        assert (record["status"], record["error"]) == (502, "upstream_error")
        assert record["response_commitment"] is not None  # the part the client received
    else:
        assert events[-1] == "data: [DONE]"
        assert (record["status"], record["error"]) == (200, None)


def test_a_hosted_answer_over_the_limit_is_502_too(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    provider = start_sim("vllm", models=("m",), zero_latency=True)
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", f"{provider.url}/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"max_response_bytes": 64},  # any chat completion is larger
    )
    response = post(gateway)
    assert response.status_code == 502
    assert error_code(response) == "upstream_error"
    assert len(provider.app.captured("/v1/chat/completions")) == 1  # no retry elsewhere


@pytest.mark.parametrize("cut", [True, False], ids=["cut", "whole"])
def test_a_json_answer_ended_by_the_close_counts_only_when_it_parses(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    cut: bool,
) -> None:
    # No length and not chunked (an HTTP/1.0 server, `connection: close`): the close ends
    # the body, and a backend that dies mid-answer closes too. A JSON answer that does not
    # parse was cut: nothing reached the client yet, so it is a failed attempt (failover),
    # never a 200 with half an answer, recorded as served.
    async def close_delimited(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n")
        writer.write(ANSWER[: len(ANSWER) // 2] if cut else ANSWER)
        await writer.drain()
        return False

    raw = start_raw(close_delimited)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = post(gateway)
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    if cut:
        assert response.status_code == 503  # its only backend failed: none left to try
        assert response.json()["error"]["code"] == "backend_unavailable"
        assert record["status"] == 503 and record["response_commitment"] is None
    else:
        assert (response.status_code, response.content) == (200, ANSWER)
        assert record["status"] == 200


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_backend_refusing_every_request_is_failed_over_not_a_black_hole(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    status: int,
) -> None:
    # A backend without the model (404: vLLM's served name differs), or that refuses the
    # gateway's key (401/403), answers at once: every request it got failed there without
    # failover. Another backend serves (the breaker stays out of it: a refusal can be the
    # request's, tests/integration/test_refusal_breaker.py).
    async def refuse(writer: asyncio.StreamWriter, _post: Post) -> bool:
        body = b'{"error": {"message": "The model `m` does not exist."}}'
        writer.write(
            b"HTTP/1.1 %d Nope\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status, len(body))
            + body
        )
        await writer.drain()
        return False

    raw = start_raw(refuse)
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway(
        [backend("broken", raw.url, "m"), backend("good", sim.url, "m")],
        routing={"pools": {"m": {"strategy": "round_robin"}}},
    )
    statuses = [post(gateway).status_code for _ in range(6)]
    assert statuses == [200] * 6
    assert 1 <= len(raw.posts) <= 3  # first for every other request, failed over each time


def test_a_dripping_error_body_does_not_hold_the_failover(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
) -> None:
    # A 503's body is read only to show its message: within the attempt's first-byte
    # budget (the failover deadline's share), not the whole answer's response_timeout_s.
    length, written = 40, [0]

    async def drip_503(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(b"HTTP/1.1 503 Busy\r\ncontent-length: %d\r\n\r\n" % length)
        for _ in range(length):
            await writer.drain()
            writer.write(b" ")
            written[0] += 1
            await asyncio.sleep(0.25)  # the fault itself: an error body that trickles in
        return False

    raw = start_raw(drip_503)
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway(
        [
            backend("dripping", raw.url, "m", first_byte_timeout_s=1.0),
            backend("good", sim.url, "m"),
        ],
        routing={"pools": {"m": {"strategy": "round_robin"}}},
        limits={"response_timeout_s": 60.0, "read_timeout_s": 5.0},
    )
    assert [post(gateway).status_code for _ in range(2)] == [200, 200]
    assert raw.finished.wait(30)
    assert written[0] < length  # the gateway hung up: the backend stopped mid-body


@pytest.mark.parametrize("status", [b"000", b"099"])
def test_a_status_under_100_is_a_failed_attempt_with_an_openai_error(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    status: bytes,
) -> None:
    # 099 used to reach uvicorn as the answer's status: it has no status line for it, so
    # the client's connection dropped without an answer while a 500 was logged; 000
    # left the request waiting for the first-byte timeout.
    async def odd_status(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = b"HTTP/1.1 %s X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % (status, len(ANSWER)) + ANSWER)
        await writer.drain()
        return False

    raw = start_raw(odd_status)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = post(gateway)
    assert response.status_code == 503
    assert error_code(response) == "backend_unavailable"
    # How it failed (`protocol`) is the operator's (metrics, logs), never the client's.
    assert "protocol" not in response.json()["error"]["message"]
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 503
