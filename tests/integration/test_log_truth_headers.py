"""The response headers a client sees, against what the log and the receipt say.

Of a private backend's headers only its content type reaches the client (on a 2xx or
3xx answer); the gateway writes the rest (`x-request-id`, `x-owngate-receipt`). A
backend's content type no client's HTTP parser reads (aiohttp refuses a header line past
8190 bytes, Node's fetch a head past 16 KiB) would leave the record stating an answer
served that the client could not read at all: it is refused before the client saw a byte
(502, the next backend may serve). Headers and trailers a backend writes to pass for the
gateway's own never reach the client, whose receipt is the one the log holds.
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
    JSON,
    USAGE_CHUNK,
    WHOLE,
    assert_logged_as_received,
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

_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream"


def _sse(content_type: bytes) -> tuple[bytes, ...]:
    """A chunked SSE answer whose content-type header is `content_type`."""
    head, *rest = chunked(EVENT, USAGE_CHUNK, DONE)
    return (
        head.replace(b"content-type: text/event-stream", b"content-type: " + content_type),
        *rest,
    )


# Content types no client should be handed: past a header line aiohttp reads, past a
# head Node's fetch reads, one byte past the bound, bytes outside visible ASCII.
UNREADABLE: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    "whole-9k": (
        (whole_answer(200, ANSWER, b"content-type: application/json; x=" + b"a" * 9000),),
        WHOLE,
    ),
    "stream-20k": (_sse(b"text/event-stream; x=" + b"a" * 20000), CHAT),
    "whole-257": (
        (whole_answer(200, ANSWER, b"content-type: application/json; x=" + b"a" * 237),),
        WHOLE,
    ),
    "whole-obs-text": (
        (whole_answer(200, ANSWER, b"content-type: application/json; x=\xff\xfe"),),
        WHOLE,
    ),
    # A type its clients do not read as the JSON the gateway read: openai-node returns a
    # string, the Python SDK in strict mode and aiohttp's `json()` raise, a browser
    # renders `text/html`; `requests` decodes the body in the charset named (UTF-16: no
    # JSON at all), while the record states the answer served with its usage.
    "whole-html": ((whole_answer(200, ANSWER, b"content-type: text/html"),), WHOLE),
    "whole-text": ((whole_answer(200, ANSWER, b"content-type: text/plain"),), WHOLE),
    "whole-utf16": (
        (whole_answer(200, ANSWER, b"content-type: application/json; charset=utf-16"),),
        WHOLE,
    ),
    "stream-not-sse": (_sse(b"text/event-streaming"), CHAT),
    "stream-302-long": (
        (
            _sse(b"text/event-stream; x=" + b"a" * 9000)[0].replace(b"200 OK", b"302 Found"),
            *_sse(b"")[1:],
        ),
        CHAT,
    ),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_a_content_type_no_client_could_read_is_a_502_before_any_byte(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """The record would otherwise say 200 and commit to an answer whose head the
    client's parser refused: the client got no answer, and its SDK sends the prompt
    again (openai-node retries a failed connection twice)."""
    pieces, ask = UNREADABLE[case]
    raw = start_raw(writes(*pieces))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ask)
    assert received.status == 502, (received.status, received.headers.get("content-type"))
    assert received.headers["content-type"] == "application/json"
    error = json.loads(received.body)["error"]
    assert error["code"] == "upstream_error" and "content-type" in error["message"]
    assert b"aaaa" not in received.body
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []
    completion = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (completion["type"], completion["status"]) == ("completion", 502)
    assert completion["response_commitment"] is None and completion["usage"] is None


@pytest.mark.parametrize("ask", [CHAT, WHOLE], ids=["stream", "whole"])
def test_the_next_backend_serves_when_one_sends_a_content_type_no_client_reads(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    ask: dict[str, Any],
) -> None:
    """The records name the first backend failed (502) and the second as the one whose
    bytes the client got, with its content type."""
    long = b"a" * 9000
    if ask is CHAT:
        bad, good = _sse(b"text/event-stream; x=" + long), _sse(b"text/event-stream; charset=utf-8")
    else:
        bad = (whole_answer(200, ANSWER, b"content-type: application/json; x=" + long),)
        good = (whole_answer(200, ANSWER, b"content-type: application/json; charset=utf-8"),)
    posts: list[str] = []
    backends = [backend(n, start_raw(first_then(posts, n, bad, good)).url, "m") for n in "ab"]
    gateway, vkey = logged(start_gateway, tmp_path, backends)
    received = client_gets(gateway, ask)
    assert received.status == 200, received.body
    assert received.headers["content-type"].endswith("; charset=utf-8")
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []
    found = request_log(tmp_path / "log", vkey, request_id)
    assert [r["type"] for r in found] == ["dispatch", "completion"] * 2
    assert [r["backend"]["id"] for r in found[::2]] == posts
    assert [r["status"] for r in found[1::2]] == [502, 200]
    assert found[1]["response_commitment"] is None


def test_a_content_type_at_the_bound_is_relayed_as_the_backend_wrote_it(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    content_type = b"application/json; x=" + b"a" * 236  # 256 bytes
    raw = start_raw(writes(whole_answer(200, ANSWER, b"content-type: " + content_type)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, WHOLE)
    assert received.status == 200
    assert received.headers["content-type"].encode() == content_type
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)


# A backend's headers and trailers named as the gateway's own, with another request's id.
_FORGED = (
    b"x-owngate-receipt: e30=",
    b"x-owngate-receipt-missing: signing-failed",
    b"x-request-id: req_000000000000000000000000",
)
FORGING: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    "whole-headers": ((whole_answer(200, ANSWER, JSON, *_FORGED),), WHOLE),
    "stream-headers": (
        (
            chunked(EVENT, DONE)[0].replace(
                b"\r\n\r\n", b"\r\n" + b"\r\n".join(_FORGED) + b"\r\n\r\n"
            ),
            *chunked(EVENT, DONE)[1:],
        ),
        CHAT,
    ),
    "whole-trailers": (
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked"
            b"\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n\r\n" % (len(ANSWER), ANSWER, b"\r\n".join(_FORGED)),
        ),
        WHOLE,
    ),
    "stream-trailers": (
        (*chunked(EVENT, DONE, last=False), b"0\r\n%s\r\n\r\n" % b"\r\n".join(_FORGED)),
        CHAT,
    ),
}


@pytest.mark.parametrize("case", list(FORGING))
def test_headers_a_backend_forges_as_the_gateways_never_reach_the_client(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """The client's request id and receipt are the gateway's (the receipt it fetches
    again is the same one), and the log says what it received."""
    pieces, ask = FORGING[case]
    raw = start_raw(writes(*pieces))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    request = json.dumps(ask).encode()
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/chat/completions",
        content=request,
        # The client's own request id is no id of the gateway's either.
        headers={
            **gateway.headers,
            "content-type": "application/json",
            "x-request-id": "req_111111111111111111111111",
        },
        timeout=60,
    ) as response:
        response.read()
        raw_headers = response.headers.raw
    names = [name.lower() for name, _ in raw_headers]
    assert names.count(b"x-request-id") == 1
    assert b"x-owngate-receipt-missing" not in names
    assert names.count(b"x-owngate-receipt") == (0 if ask is CHAT else 1)
    values = b"".join(v for _, v in raw_headers)
    assert b"req_000000000000000000000000" not in values
    assert b"req_111111111111111111111111" not in values
    assert b"e30=" not in values
    received = client_gets(gateway, ask)
    assert received.status == 200
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
