"""A private backend's answer at its edges, against what the client gets and the log says.

A redirect is no answer: the gateway follows none, and relayed (its `location` dropped,
as every header but the content type is) the client got a 3xx it could not follow while
the record stated it served. A 2xx whole JSON answer that opens an object but does not
parse (cut short inside its framing, garbage after the object) is no answer an SDK reads
either. Each fails the attempt before the client saw a byte (`shape`): the next backend
serves, else the client gets 502 `upstream_error` and the record says 502.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
    whole_answer,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.log_truth import CHAT
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.sdk_stream import counts, sdk_shown_usage

_ELSEWHERE = b"location: http://203.0.113.9/v1/chat/completions"
_SSE_TYPE = b"content-type: text/event-stream"
_EVENTS = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
_EVENTS += b'"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


def _chunked(status: int, body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 %d X\r\ntransfer-encoding: chunked\r\n" % status
    head += b"".join(h + b"\r\n" for h in headers) + b"\r\n"
    return head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def _ended_by_close(body: bytes) -> bytes:
    """A 200 JSON answer with no length and no chunks: the backend's close ends it."""
    return b"HTTP/1.1 200 OK\r\n%s\r\nconnection: close\r\n\r\n%s" % (JSON, body)


# (the backend's answer, the request)
REFUSED: dict[str, tuple[bytes, dict[str, object]]] = {
    **{
        f"{status}-whole": (whole_answer(status, ANSWER, JSON, _ELSEWHERE), WHOLE)
        for status in (300, 301, 302, 303, 307, 308)
    },
    "307-empty": (whole_answer(307, b"", _ELSEWHERE), WHOLE),
    "307-html": (whole_answer(307, b"<a>moved</a>", b"content-type: text/html"), WHOLE),
    "308-stream": (_chunked(308, _EVENTS, _SSE_TYPE, _ELSEWHERE), CHAT),
    "302-stream-close": (
        b"HTTP/1.1 302 Found\r\ncontent-type: text/event-stream\r\n"
        + _ELSEWHERE
        + b"\r\n\r\n"
        + _EVENTS,
        CHAT,
    ),
    "200-cut-short": (whole_answer(200, ANSWER[:-7], JSON), WHOLE),
    "200-garbage-after-brace": (whole_answer(200, b"{<html>oops</html>", JSON), WHOLE),
    "200-garbage-after-object": (whole_answer(200, ANSWER + b"<!-- proxy -->", JSON), WHOLE),
    "200-two-objects": (whole_answer(200, ANSWER + ANSWER, JSON), WHOLE),
    "200-chunked-cut-short": (_chunked(200, ANSWER[:-1], JSON), WHOLE),
    "200-not-utf8": (whole_answer(200, b'{"id":"\xff"}', JSON), WHOLE),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_redirect_or_an_unparsable_object_is_a_502_and_recorded_so(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    answer, ask = REFUSED[case]
    raw = start_raw(writes(answer))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ask)
    assert "location" not in received.headers
    assert_shape_failure_recorded(received, tmp_path / "log", vkey)


@pytest.mark.parametrize("first", ["307-whole", "308-stream", "200-cut-short"])
def test_the_next_backend_serves_after_a_redirect_or_an_unparsable_object(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    first: str,
) -> None:
    """The records name the first backend failed (502, nothing committed) and the second
    as the one whose answer the client got."""
    bad, ask = REFUSED[first]
    good = whole_answer(200, ANSWER, JSON) if ask is WHOLE else _chunked(200, _EVENTS, _SSE_TYPE)
    posts: list[str] = []
    backends = [backend(n, start_raw(first_then(posts, n, (bad,), (good,))).url, "m") for n in "ab"]
    gateway, vkey = logged(start_gateway, tmp_path, backends)
    received = client_gets(gateway, ask)
    assert received.status == 200, received.body
    if ask is WHOLE:
        assert received.body == ANSWER
    else:
        assert received.body.startswith(_EVENTS)  # and the receipt's comment
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    found = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])
    assert [r["type"] for r in found] == ["dispatch", "completion"] * 2
    assert [r["backend"]["id"] for r in found[::2]] == posts
    assert [r["status"] for r in found[1::2]] == [502, 200]
    assert found[1]["response_commitment"] is None


@pytest.mark.parametrize(
    "body",
    [
        ANSWER + b" \r\n\t",
        ANSWER[:-1] + b',"score":NaN}',
        ANSWER[:-1] + b',"big":1e400}',
        b"\xef\xbb\xbf" + ANSWER,
        ANSWER.decode().encode("utf-16"),
    ],
    ids=["trailing-whitespace", "nan", "past-double", "utf-8-bom", "utf-16"],
)
@pytest.mark.parametrize("closed", [False, True], ids=["framed", "ended-by-close"])
def test_an_object_the_clients_parser_reads_is_relayed_as_written(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    body: bytes,
    closed: bool,
) -> None:
    """What `json.loads(bytes)` (httpx's `response.json()`, the OpenAI SDK's) reads is an
    answer, though orjson refuses some of it; and its usage is recorded as it read it.
    Ended by the close (no length, not chunked), it is whole as the client reads it too:
    orjson alone told it whole before, so the answer was failed as cut short (503)."""
    answer = _ended_by_close(body) if closed else whole_answer(200, body, JSON)
    raw = start_raw(writes(answer))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, WHOLE)
    assert received.status == 200, received.body
    assert received.body == body
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])[-1]
    assert completion["usage"]["total_tokens"] == 8


_USAGE_EVENT = b'data: {"id":"c","object":"chat.completion.chunk","choices":[],'
_USAGE_EVENT += b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
_DONE = b"data: [DONE]\n\n"
# A 2xx stream whose first bytes the OpenAI SDK reads no event of: relayed as written.
UNREAD_STREAMS: dict[str, bytes] = {
    # the SDK reads `\ufeffdata` as a field name it ignores: not the event
    "bom-first": b"\xef\xbb\xbf" + _USAGE_EVENT + _DONE,
    "not-json-first": b"data: <html>\n\n" + _USAGE_EVENT + _DONE,  # the SDK raises there
    "name-and-no-data-first": b"event: x\n\n" + _USAGE_EVENT + _DONE,  # json.loads("")
    "only-a-comment": b": ping\n\n",
    "only-done": _DONE,
    "only-blank-lines": b"\n\n\n",
}


@pytest.mark.parametrize("case", list(UNREAD_STREAMS))
def test_a_stream_whose_events_the_sdk_does_not_read_is_recorded_as_it_read_it(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """Its head went out with its first chunk, which need not hold a whole event: the
    client got 200 and those bytes, and the record says so, with the usage the SDK
    showed (none, though the backend wrote one after what the SDK stopped at)."""
    body = UNREAD_STREAMS[case]
    raw = start_raw(writes(_chunked(200, body, _SSE_TYPE)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, {**CHAT, "stream_options": {"include_usage": True}})
    assert received.status == 200, received.body
    assert received.body.startswith(body)
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])[-1]
    assert completion["status"] == 200 and completion["response_commitment"] is not None
    assert completion["usage"] is None
    assert counts(sdk_shown_usage(received.body)) is None
