"""Issue 15: a hosted provider cannot countersign, so the completion record keeps the
provider's own response id and request-id headers for reconciling with its usage export.
A hostile provider's values (huge, control characters, non-ASCII, a prompt's text) must
neither break the record nor reach the log or the gateway's log lines; well-formed ones
beside them are still kept.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateways import LITELLM_WARNINGS, Gateway
from tests.helpers.log_capture import rendered_logs
from tests.helpers.log_truth import hosted_gateway
from tests.helpers.provenance import completion_record, records
from tests.helpers.raw_backend import Answer, Post, RawBackend

pytestmark = LITELLM_WARNINGS

SECRET = "patient-record-4711"
HOSTILE_ID = "chatcmpl-\x1b[31m" + SECRET  # an escape sequence and free text
HOSTILE_HEADERS = (
    b"x-request-id: "
    + b"A" * 8000
    + b"\r\n"  # huge (aiohttp, LiteLLM's transport, takes header lines up to 8190 bytes)
    b"openai-request-id: req\x7fbad\r\n"  # a control character (DEL, which h11 lets through)
    b"x-goog-request-id: " + SECRET.encode() + b" said hello\r\n"  # text, not an id
    b"request-id: req_good-0001\r\n"  # well formed: kept
    b"x-amzn-requestid: ok\r\n"
    b"x-amzn-requestid: second-value\r\n"  # two values: ambiguous, neither kept
)


# Non-ASCII (UTF-8 on the wire, obs-text to HTTP): LiteLLM 1.x fails the whole call on it
# ('ascii' codec can't encode), so the answer is a 503; nothing of it may reach a record.
NON_ASCII = b"apim-request-id: r\xc3\xa9q-\xe2\x80\xae" + SECRET.encode() + b"\r\n"


def _provider(response_id: str, headers: bytes = HOSTILE_HEADERS) -> Answer:
    body = json.dumps(
        {
            "id": response_id,
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    ).encode()

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + headers
            + b"content-length: %d\r\n\r\n" % len(body)
        )
        writer.write(head + body)
        await writer.drain()
        return False

    return answer


# The DEL request id in any spelling a record or a log line could give it ("bad" alone can
# occur in a record's hex digests by chance).
_DEL_ID = (b"\x7fbad", b"\\u007fbad", b"\\x7fbad", b"reqbad", b"req?bad", b"req_bad")


def _written(tmp_path: Path, logs: str) -> bytes:
    """The log's records as JSON (escapes kept escaped) and the gateway's log lines."""
    logged = json.dumps(records(tmp_path / "log"), ensure_ascii=False)
    return (logged + logs).encode()


@pytest.mark.parametrize("response_id", [HOSTILE_ID, "x" * 129, "chatcmpl-ok_0001"])
def test_hostile_provider_ids_stay_out_of_the_record_and_the_logs(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    response_id: str,
) -> None:
    provider = start_raw(_provider(response_id))
    with rendered_logs() as logs:
        gateway = hosted_gateway(start_gateway, tmp_path, f"{provider.url}/v1", "m")
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
        )
        assert response.status_code == 200, response.text
        record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    kept = None if response_id != "chatcmpl-ok_0001" else response_id
    assert record["upstream"] == {
        "response_id": kept,
        "request_ids": [
            {"header": "request-id", "value": "req_good-0001"},
        ],
        "model": "m",
    }
    written = _written(tmp_path, logs.getvalue())
    for hostile in (SECRET.encode(), b"A" * 200, b"\x1b", b"\\u001b", *_DEL_ID, b"second-value"):
        assert hostile not in written
    assert response.headers["x-request-id"] != "A" * 8000  # the gateway's own, not the provider's


def test_a_non_ascii_provider_id_breaks_no_record_and_reaches_no_log(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    provider = start_raw(_provider("chatcmpl-ok_0001", HOSTILE_HEADERS + NON_ASCII))
    with rendered_logs() as logs:
        gateway = hosted_gateway(start_gateway, tmp_path, f"{provider.url}/v1", "m")
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
        )
        assert response.status_code in (200, 503), response.text
        assert set(response.json()) == (
            {"error"} if response.status_code == 503 else set(response.json())
        )
        record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == response.status_code
    written = _written(tmp_path, logs.getvalue()) + response.content
    for hostile in (SECRET.encode(), b"\xc3\xa9", b"\\u00e9", b"A" * 200, *_DEL_ID):
        assert hostile not in written


def _answer_naming_itself(stream: bool) -> Answer:
    """A provider that sends `x-request-id` and no other request-id header, as OpenAI
    does, on a whole answer or a stream."""
    chunk = {"id": "chatcmpl-own_0002", "object": "chat.completion.chunk", "created": 1}
    events = [
        {**chunk, "model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {**chunk, "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n"

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        if not stream:
            await _provider("chatcmpl-own_0002", b"x-request-id: req_own-0002\r\n")(writer, post)
            return False
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"x-request-id: req_own-0002\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        writer.write(head + body)
        await writer.drain()
        return False

    return answer


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_record_names_only_the_request_id_headers_the_provider_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    stream: bool,
) -> None:
    """LiteLLM adds a `request-id` of its own beside the provider's `x-request-id` (a
    copy): the record named a `request-id` header the provider never sent."""
    provider = start_raw(_answer_naming_itself(stream))
    gateway = hosted_gateway(start_gateway, tmp_path, f"{provider.url}/v1", "m")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 200, response.text
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["upstream"] == {
        "response_id": "chatcmpl-own_0002",
        "request_ids": [{"header": "x-request-id", "value": "req_own-0002"}],
        "model": "m",
    }


# Azure OpenAI opens a stream with its prompt filter's results: a chunk with no choices and
# `id: ""` (and `model: ""`), before the chunks that carry the answer's id.
PROMPT_FILTER_CHUNK = {
    "id": "",
    "object": "",
    "created": 0,
    "model": "",
    "choices": [],
    "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
}


def _stream_named_late(first: dict[str, object]) -> Answer:
    """A stream whose `first` chunk names no answer, then the answer `chatcmpl-late_0003`."""
    chunk = {"id": "chatcmpl-late_0003", "object": "chat.completion.chunk", "model": "m"}
    events = [
        first,
        {**chunk, "choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n"

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return False

    return answer


@pytest.mark.parametrize(
    "first",
    [PROMPT_FILTER_CHUNK, {k: v for k, v in PROMPT_FILTER_CHUNK.items() if k != "id"}],
    ids=["empty-id", "no-id"],
)
def test_a_stream_opened_by_a_chunk_naming_no_answer_is_recorded_by_the_answers_id(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    first: dict[str, object],
) -> None:
    """The record named the stream's first chunk's id, so a stream opened by one naming
    no answer (Azure's prompt filter results) was recorded with none, though every chunk
    of the answer the client got carried the provider's id. Without an id of its own, the
    first chunk gets LiteLLM's made-up one, which is never recorded either."""
    provider = start_raw(_stream_named_late(first))
    gateway = hosted_gateway(start_gateway, tmp_path, f"{provider.url}/v1", "m")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=60
    )
    assert response.status_code == 200, response.text
    assert b'"id":"chatcmpl-late_0003"' in response.content  # what the client got
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 200
    assert record["upstream"]["response_id"] == "chatcmpl-late_0003"
