"""A private backend's "success" no OpenAI client can read, against what the log says.

A 204, 205 or 304 has no body; a 2xx whose body is empty, HTML or a bare JSON value is
not a completion, a chat completion or embeddings either: the OpenAI SDKs fail to parse
it (or parse something that is not the answer), while the record would have stated a
success served. Such an answer fails the attempt before the client saw a byte (`shape`):
the next backend serves, or the client gets 502 `upstream_error` in OpenAI's error
format and the completion record says 502 with no response commitment.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.audit_rig import (
    ANSWER,
    JSON,
    WHOLE,
    assert_logged_as_received,
    assert_shape_failure_recorded,
    client_gets,
    first_then,
    logged,
    request_log,
    settled,
    whole_answer,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.independent_audit import audit
from tests.helpers.log_truth import CHAT
from tests.helpers.raw_backend import Answer, Post, RawBackend

_EMBED = {"model": "m", "input": "hi"}
_COMPLETE = {"model": "m", "prompt": "hi"}
_CHAT_PATH = "/v1/chat/completions"

# (the backend's answer, the request, its path)
UNREADABLE: dict[str, tuple[bytes, dict[str, Any], str]] = {
    "204-chat": (b"HTTP/1.1 204 No Content\r\n\r\n", WHOLE, _CHAT_PATH),
    "204-json-type": (b"HTTP/1.1 204 No Content\r\n" + JSON + b"\r\n\r\n", WHOLE, _CHAT_PATH),
    "205-chat": (b"HTTP/1.1 205 Reset Content\r\ncontent-length: 0\r\n\r\n", WHOLE, _CHAT_PATH),
    "304-chat": (b"HTTP/1.1 304 Not Modified\r\n" + JSON + b"\r\n\r\n", WHOLE, _CHAT_PATH),
    "304-stream": (b"HTTP/1.1 304 Not Modified\r\n\r\n", CHAT, _CHAT_PATH),
    "200-empty": (whole_answer(200, b"", JSON), WHOLE, _CHAT_PATH),
    "200-spaces": (whole_answer(200, b" \r\n\t ", JSON), WHOLE, _CHAT_PATH),
    "200-html": (
        whole_answer(200, b"<html>ok</html>", b"content-type: text/html"),
        WHOLE,
        _CHAT_PATH,
    ),
    "200-json-array": (whole_answer(200, b"[]", JSON), WHOLE, _CHAT_PATH),
    "200-json-null": (whole_answer(200, b"null", JSON), WHOLE, _CHAT_PATH),
    "201-empty": (whole_answer(201, b"", JSON), WHOLE, _CHAT_PATH),
    "204-embeddings": (b"HTTP/1.1 204 No Content\r\n\r\n", _EMBED, "/v1/embeddings"),
    "200-empty-embeddings": (whole_answer(200, b"", JSON), _EMBED, "/v1/embeddings"),
    "204-completions": (b"HTTP/1.1 204 No Content\r\n\r\n", _COMPLETE, "/v1/completions"),
    "200-text-completions": (
        whole_answer(200, b"done", b"content-type: text/plain"),
        _COMPLETE,
        "/v1/completions",
    ),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_an_answer_no_client_reads_is_a_502_and_recorded_so(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    answer, ask, path = UNREADABLE[case]
    raw = start_raw(writes(answer))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ask, path)
    assert received.headers["content-type"] == "application/json"
    assert_shape_failure_recorded(received, tmp_path / "log", vkey)


@pytest.mark.parametrize("first", ["204-chat", "200-empty", "304-chat"])
def test_the_next_backend_serves_when_one_answers_an_empty_success(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    first: str,
) -> None:
    """The records name the first backend failed (502, nothing committed) and the second
    as the one whose answer the client got."""
    bad = (UNREADABLE[first][0],)
    good = (whole_answer(200, ANSWER, JSON),)
    posts: list[str] = []
    backends = [backend(n, start_raw(first_then(posts, n, bad, good)).url, "m") for n in "ab"]
    gateway, vkey = logged(start_gateway, tmp_path, backends)
    received = client_gets(gateway, WHOLE)
    assert received.status == 200, received.body
    assert received.body == ANSWER
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    found = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])
    assert [r["type"] for r in found] == ["dispatch", "completion"] * 2
    assert [r["backend"]["id"] for r in found[::2]] == posts
    assert [r["status"] for r in found[1::2]] == [502, 200]
    assert found[1]["response_commitment"] is None


@pytest.mark.parametrize(
    "body",
    [b"  \r\n" + ANSWER, b"\xef\xbb\xbf" + ANSWER, ANSWER.decode().encode("utf-16")],
    ids=["leading-whitespace", "utf-8-bom", "utf-16"],
)
def test_a_json_object_json_loads_reads_is_relayed_as_written(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    body: bytes,
) -> None:
    """The check reads the opening as `json.loads(bytes)` (httpx's `response.json()`)
    does: whitespace, a byte order mark and UTF-16 are no reason to refuse an answer."""
    raw = start_raw(writes(whole_answer(200, body, JSON)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, WHOLE)
    assert received.status == 200, received.body
    assert received.body == body
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)


_EMBEDDING = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],'
_EMBEDDING += b'"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}'


def _vllm_embeddings(posts: list[Post]) -> Answer:
    """vLLM's `/v1/embeddings`: `encoding_format` `bytes` or `bytes_only` is answered 200
    `application/octet-stream`, the raw floats (shape and dtype in a `metadata` header
    only with `bytes`); `float` and `base64` as a JSON object."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        posts.append(post)
        if json.loads(post.body).get("encoding_format") in ("bytes", "bytes_only"):
            binary = b"\x00\x00\x00\x3f"  # 0.5 as little-endian float32
            reply = whole_answer(200, binary, b"content-type: application/octet-stream")
        else:
            reply = whole_answer(200, _EMBEDDING, JSON)
        return await writes(reply)(writer, post)

    return answer


@pytest.mark.parametrize("encoding", ["bytes", "bytes_only", "FLOAT", "Base64", 7, ["float"]])
def test_an_embeddings_encoding_no_client_reads_here_is_refused_before_any_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    encoding: object,
) -> None:
    """A client that asks vLLM for its binary embeddings got the 502 of an answer of the
    wrong shape, charged to the backend's breaker by the client's own choice: it is a 400
    naming the field, and no backend sees the request; `float` and `base64` are served.
    Compared exactly, as the backends compare it: llama-server answers `FLOAT` or
    `Base64` with its own 400, vLLM (a pydantic `Literal`) too."""
    posts: list[Post] = []
    raw = start_raw(_vllm_embeddings(posts))
    gateway, _ = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    refused = client_gets(gateway, {**_EMBED, "encoding_format": encoding}, "/v1/embeddings")
    assert refused.status == 400, (refused.status, refused.body)
    error = json.loads(refused.body)["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "encoding_format")
    assert posts == []
    for served in ("float", "base64", None):
        received = client_gets(gateway, {**_EMBED, "encoding_format": served}, "/v1/embeddings")
        assert received.status == 200, (served, received.status, received.body)
        assert received.body == _EMBEDDING
    assert len(posts) == 3


_EVENTS = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
_EVENTS += b'"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
_SSE_TYPE = b"content-type: text/event-stream\r\n"
# A stream request answered by a no-body status labelled as a stream (framed as given).
NO_BODY_STREAMS: dict[str, bytes] = {
    "204": b"HTTP/1.1 204 No Content\r\n" + _SSE_TYPE + b"\r\n",
    "304": b"HTTP/1.1 304 Not Modified\r\n" + _SSE_TYPE + b"\r\n",
    "205-chunked": b"HTTP/1.1 205 Reset Content\r\n"
    + _SSE_TYPE
    + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(_EVENTS), _EVENTS),
    "205-length": b"HTTP/1.1 205 Reset Content\r\n"
    + _SSE_TYPE
    + b"content-length: %d\r\n\r\n%s" % (len(_EVENTS), _EVENTS),
    "205-close": b"HTTP/1.1 205 Reset Content\r\n"
    + _SSE_TYPE
    + b"connection: close\r\n\r\n"
    + _EVENTS,
}


@pytest.mark.parametrize("case", list(NO_BODY_STREAMS))
def test_a_no_body_status_labelled_a_stream_is_a_502_and_recorded_so(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """A 205 `text/event-stream` with events was relayed as a stream under 205 and its
    record committed to them, while a fetch-based client (the OpenAI Node SDK: 204, 205
    and 304 are the Fetch standard's null body statuses) reads no body under it; a 204 or
    304 one failed as `closed`, a 503 with no word of the wrong shape. Each is the 502 of
    an answer of the wrong shape, recorded so."""
    raw = start_raw(writes(NO_BODY_STREAMS[case]))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, CHAT)
    assert received.status == 502, (received.status, received.body)
    error = json.loads(received.body)["error"]
    assert error["code"] == "upstream_error" and "wrong shape" in error["message"]
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []
    completion = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (completion["type"], completion["status"]) == ("completion", 502)
    assert completion["response_commitment"] is None
