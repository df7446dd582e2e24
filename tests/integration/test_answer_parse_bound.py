"""A private backend's whole answer is parsed on the event loop only within a bound on its
arrays and objects (`usage_read.MAX_CONTAINERS`), over real sockets.

A hostile backend answering 15 MiB of `[],[],...` held the event loop 0.9 s and grew the
gateway by 510 MB to read its usage; ended by the close instead of framed, 6.8 s (the
completeness check parsed it with the collector running). Past the bound a framed answer
is relayed exactly with its usage unknown (the record states none), and one ended by the
close cannot be told whole: a failed attempt, as one cut short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.api.usage_read import MAX_CONTAINERS, MAX_FALLBACK
from tests.helpers.audit_rig import (
    JSON,
    WHOLE,
    assert_shape_failure_recorded,
    client_gets,
    first_then,
    logged,
    request_log,
    settled,
    whole_answer,
    writes,
)
from tests.helpers.gateways import Gateway, backend, logged_private_gateway
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
USAGE = b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}'
ORIGIN = "test.owngate/parse-bound"


def answer_of(arrays: int) -> bytes:
    """A chat answer with its usage and `arrays` empty arrays besides."""
    return (
        b'{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"hello"}}],'
        + USAGE
        + b',"x":['
        + b"[]," * arrays
        + b"0]}"
    )


def post(gateway: Gateway) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=60
    )


def answering(body: bytes, *, framed: bool) -> Answer:
    async def answer(writer: asyncio.StreamWriter, _: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        framing = b"content-length: %d" % len(body) if framed else b"connection: close"
        head += framing + b"\r\n\r\n"
        writer.write(head + body)
        await writer.drain()
        return False

    return answer


@pytest.mark.parametrize(
    ("arrays", "read"), [(MAX_CONTAINERS - 8, True), (MAX_CONTAINERS + 1, False)]
)
def test_a_framed_answer_past_the_bound_is_relayed_with_its_usage_unknown(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    arrays: int,
    read: bool,
) -> None:
    body = answer_of(arrays)
    raw = start_raw(answering(body, framed=True))
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = post(gateway)
    assert (response.status_code, response.content) == (200, body)
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 200
    expected = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert record["usage"] == (expected if read else None)


@pytest.mark.parametrize(
    ("arrays", "cut"),
    [(MAX_CONTAINERS - 8, False), (MAX_CONTAINERS + 1, False), (MAX_CONTAINERS + 1, True)],
)
def test_an_answer_ended_by_the_close_past_the_bound_is_whole_only_when_it_parses(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    arrays: int,
    cut: bool,
) -> None:
    """Past the bound its syntax alone tells it whole, as a parse does within it."""
    body = answer_of(arrays)[: -1 if cut else None]
    raw = start_raw(answering(body, framed=False))
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = post(gateway)
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    if not cut:
        assert (response.status_code, response.content) == (200, body)
        assert record["status"] == 200
    else:
        assert response.status_code == 503  # its only backend failed: none left to try
        assert response.json()["error"]["code"] == "backend_unavailable"
        assert record["status"] == 503 and record["response_commitment"] is None


# Answers past the read bounds that `json.loads` refuses: past `MAX_CONTAINERS`, over
# `MAX_FALLBACK` bytes (orjson refused them, the standard library does not read so many),
# nested deeper than `MAX_DEPTH`. Each was relayed as served.
_PAST = answer_of(MAX_CONTAINERS + 1)
_LONG = b'{"id":"c","choices":[{"message":{"content":"' + b"x" * (MAX_FALLBACK + 8) + b'"}}]}'
UNPARSABLE = {
    "cut-short": _PAST[:-1],
    "garbage-after": _PAST + b"<!-- proxy -->",
    "bad-escape": _PAST[:-1] + b',"s":"\\x"}',
    "not-utf8": _PAST[:-1] + b',"s":"\xff"}',
    "long-cut-short": _LONG[:-1],
    "long-control-character": _LONG.replace(b"xx", b"x\x01", 1),
    "deep-then-garbage": b'{"a":' + b"[" * 600 + b"x",
    # more digits than `int` converts (4,300): the client's `json.loads` raises
    "long-integer": _LONG[:-1] + b',"n":' + b"7" * 5000 + b"}",
}


@pytest.mark.parametrize("case", list(UNPARSABLE))
def test_an_unparsable_answer_past_the_bound_is_a_502_and_recorded_so(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    raw = start_raw(writes(whole_answer(200, UNPARSABLE[case], JSON)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    assert_shape_failure_recorded(client_gets(gateway, WHOLE), tmp_path / "log", vkey)


def test_the_next_backend_serves_after_an_unparsable_answer_past_the_bound(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The records name the first backend failed (502, nothing committed) and the second
    as the one whose answer the client got, relayed exactly (with its usage unknown: the
    independent audit would find the usage shown missing from the record)."""
    bad, good = whole_answer(200, _PAST[:-1], JSON), whole_answer(200, _PAST, JSON)
    posts: list[str] = []
    backends = [backend(n, start_raw(first_then(posts, n, (bad,), (good,))).url, "m") for n in "ab"]
    gateway, vkey = logged(start_gateway, tmp_path, backends)
    received = client_gets(gateway, WHOLE)
    assert (received.status, received.body) == (200, _PAST)
    settled(tmp_path / "log", vkey, received.headers["x-request-id"])
    found = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])
    assert [r["backend"]["id"] for r in found[::2]] == posts
    assert [r["status"] for r in found[1::2]] == [502, 200]
    assert found[1]["response_commitment"] is None
    assert found[3]["usage"] is None  # past the bound: relayed with its usage unknown
