"""A private backend that answers in the other shape than the request asked for: a whole
JSON answer to `stream: true`, an event stream to a request that is not a stream. The
client would read it in its own shape (the OpenAI SDK parses a stream request's answer
as SSE and any other as JSON) and be shown none of the usage the record would state, so
the answer is a broken one: refused before the client saw a byte (502 `upstream_error`,
the next backend tried, a breaker failure), the record saying what the client got. An
error status still passes as an error, whatever the request's shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.audit_rig import (
    ANSWER,
    ASKS_USAGE,
    JSON,
    USAGE,
    USAGE_CHUNK,
    WHOLE,
    chunked,
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
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.raw_backend import Answer, RawBackend

# A stream request answered whole (the record read its usage: 8; the SDK showed none),
# and a whole request answered as a stream (the SDK's `response.json()` fails).
WRONG: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    "whole-to-stream": ((whole_answer(200, ANSWER, JSON),), CHAT),
    "whole-to-stream-asking-usage": ((whole_answer(200, ANSWER, JSON),), ASKS_USAGE),
    "stream-to-whole": (chunked(EVENT, USAGE_CHUNK, DONE), WHOLE),
    "stream-to-no-stream-flag": (
        chunked(EVENT, USAGE_CHUNK, DONE),
        {k: v for k, v in WHOLE.items() if k != "stream"},
    ),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_an_answer_of_the_wrong_shape_is_a_502_before_any_byte(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    pieces, ask = WRONG[case]
    raw = start_raw(writes(*pieces))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ask)
    assert received.status == 502, received.body
    assert received.headers["content-type"].startswith("application/json")
    error = json.loads(received.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "upstream_error" and "wrong shape" in error["message"]
    assert b"usage" not in received.body and b"hi" not in received.body
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []
    completion = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert completion["type"] == "completion"
    assert (completion["status"], completion["usage"]) == (502, None)
    assert completion["response_commitment"] is None
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    assert 'owngate_upstream_errors_total{backend="gpu",kind="shape"} 1' in metrics


@pytest.mark.parametrize("case", ["whole-to-stream", "stream-to-whole"])
def test_the_next_backend_serves_and_the_first_one_s_breaker_counts_it(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """The first backend asked answers in the wrong shape, the other in the right one:
    the client gets the second one's answer, the records say the first failed (502) and
    the second served what the client read; with a breaker one failure opens, the first
    is not asked again."""
    pieces, ask = WRONG[case]
    right = chunked(EVENT, USAGE_CHUNK, DONE) if ask is CHAT else (whole_answer(200, ANSWER, JSON),)
    posts: list[str] = []  # the backends asked, in order
    backends = [backend(n, start_raw(first_then(posts, n, pieces, right)).url, "m") for n in "ab"]
    breaker = {"breaker": {"failure_threshold": 1, "cooldown_s": 60, "max_cooldown_s": 60}}
    gateway, vkey = logged(start_gateway, tmp_path, backends, routing=breaker)
    received = client_gets(gateway, ask)
    assert received.status == 200, received.body
    assert sorted(posts) == ["a", "b"]
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []
    found = request_log(tmp_path / "log", vkey, request_id)
    assert [r["type"] for r in found] == ["dispatch", "completion"] * 2
    assert [r["backend"]["id"] for r in found[::2]] == posts
    assert [r["status"] for r in found[1::2]] == [502, 200]
    if ask is CHAT:  # held back from the client, recorded
        assert b'"usage"' not in received.body
    assert found[3]["usage"] == json.loads(USAGE)
    again = client_gets(gateway, ask)
    assert again.status == 200 and posts[2:] == posts[1:2]


@pytest.mark.parametrize("ask", [CHAT, WHOLE], ids=["stream", "whole"])
def test_an_error_status_passes_as_an_error_whatever_the_shape(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    ask: dict[str, Any],
) -> None:
    """A 400 JSON error body to a stream request (or an SSE-typed one to a whole
    request) is the backend's refusal, told to the client as such: not a wrong shape."""
    body = b'{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}'
    kind = JSON if ask is CHAT else b"content-type: text/event-stream"
    raw = start_raw(writes(whole_answer(400, body, kind)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ask)
    assert received.status == 400, received.body
    assert "wrong shape" not in json.loads(received.body)["error"]["message"]
    settled(tmp_path / "log", vkey, received.headers["x-request-id"])
    assert audit(received, tmp_path / "log", vkey) == []
