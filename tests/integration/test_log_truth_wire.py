"""The log says what the client received, read off the wire: a raw-socket client keeps
the exact status, header lines and body bytes of each answer (no HTTP library between,
chunked framing undone by httptools) and the independent auditor
(tests/helpers/independent_audit.py, from docs/provenance.md alone) checks each against
the signed log: status, request commitment over the bytes sent, response commitment over
the bytes got, backend, stream outcome.

Shapes an HTTP library would smooth over: two requests pipelined on one keep-alive
connection (each answer's bytes opened by its own record, never the other's), an
HTTP/1.0 client (a stream ended by the close), a client's own `x-request-id` and
`accept-encoding: gzip` (the gateway's id, one header line, an answer in no coding), and
backend answers the gateway rewrites: a `103` or `100` before the answer, a body longer
than its `content-length`, two `content-length` lines, `transfer-encoding` with a
`content-length`, bytes that are not UTF-8 or not JSON with status 200.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httptools
import pytest

from tests.helpers.audit_rig import (
    ANSWER,
    JSON,
    WHOLE,
    chunked,
    logged,
    settled,
    whole_answer,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.independent_audit import Received, audit
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.raw_backend import Answer, RawBackend

WIRE: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    "early-hints": (
        (b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + whole_answer(200, ANSWER, JSON),),
        WHOLE,
    ),
    "continue": ((b"HTTP/1.1 100 Continue\r\n\r\n" + whole_answer(200, ANSWER, JSON),), WHOLE),
    "longer-than-declared": (
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n"
            + ANSWER,
        ),
        WHOLE,
    ),
    "two-lengths": (
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n"
            b"content-length: %d\r\n\r\n" % len(ANSWER) + ANSWER,
        ),
        WHOLE,
    ),
    "chunked-and-length": (
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n"
            b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(ANSWER), ANSWER),
        ),
        WHOLE,
    ),
    "not-utf8": ((whole_answer(200, b'\xff\xfe{"a":1}', JSON),), WHOLE),
    "not-json": ((whole_answer(200, b'{"a":', JSON),), WHOLE),
    "error-400": ((whole_answer(400, b'{"error":{"message":"bad \xff"}}', JSON),), WHOLE),
    "stream-cut": (chunked(EVENT, b'data: {"id', last=False), CHAT),
}


def _request(gateway: Gateway, body: bytes, *extra: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    lines = [
        b"POST /v1/chat/completions " + version,
        b"host: gateway",
        b"authorization: Bearer " + gateway.key.encode(),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        *extra,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _wire(
    port: int, data: bytes, answers: int
) -> list[tuple[int, list[tuple[bytes, bytes]], bytes]]:
    """Send `data`, read until `answers` final answers are complete (or the close): each
    as (status, header lines in order, body bytes as the framing delivered them)."""
    got: list[dict[str, Any]] = []

    class Parse:
        def on_message_begin(self) -> None:
            got.append({"headers": [], "body": b"", "done": False})

        def on_header(self, name: bytes, value: bytes) -> None:
            got[-1]["headers"].append((name.lower(), value))

        def on_headers_complete(self) -> None:
            got[-1]["status"] = parser.get_status_code()

        def on_body(self, body: bytes) -> None:
            got[-1]["body"] += body

        def on_message_complete(self) -> None:
            got[-1]["done"] = True

    parser = httptools.HttpResponseParser(Parse())
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(data)
        for _ in range(10_000):  # reads, bounded
            piece = sock.recv(1 << 16)
            if not piece:
                parser.feed_data(b"")  # (an HTTP/1.0 body ends with the close)
                break
            parser.feed_data(piece)
            if sum(1 for g in got if g["done"] and g["status"] >= 200) >= answers:
                break
    finals = [g for g in got if g["status"] >= 200]
    return [(g["status"], g["headers"], g["body"]) for g in finals]


def _audited(
    gateway: Gateway,
    tmp_path: Path,
    vkey: str,
    answer: tuple[int, list[tuple[bytes, bytes]], bytes],
    sent: bytes,
) -> Received:
    status, lines, body = answer
    names = [name for name, _ in lines]
    assert names.count(b"x-request-id") == 1, lines
    assert names.count(b"x-owngate-receipt") <= 1 and b"content-encoding" not in names, lines
    headers = {name.decode(): value.decode("latin-1") for name, value in lines}
    received = Received(status, headers, body, sent)
    settled(tmp_path / "log", vkey, headers["x-request-id"])
    assert audit(received, tmp_path / "log", vkey) == [], (status, body[:300])
    return received


@pytest.mark.parametrize("case", list(WIRE))
def test_answers_the_gateway_rewrites_are_logged_as_they_came_off_the_wire(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    pieces, ask = WIRE[case]
    raw = start_raw(writes(*pieces))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    sent = json.dumps(ask).encode()
    extra = (b"x-request-id: req_000000000000000000000000", b"accept-encoding: gzip")
    (answer,) = _wire(gateway.server.port, _request(gateway, sent, *extra), 1)
    received = _audited(gateway, tmp_path, vkey, answer, sent)
    assert received.headers["x-request-id"] != "req_000000000000000000000000"


@pytest.mark.parametrize("ask", [WHOLE, CHAT], ids=["whole", "stream"])
def test_pipelined_answers_each_open_only_their_own_record(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    ask: dict[str, Any],
) -> None:
    """Two requests in one write on a keep-alive connection, different bodies: each answer
    opens its own record, and one's bytes under the other's receipt are a finding."""
    pieces = (whole_answer(200, ANSWER, JSON),) if ask is WHOLE else chunked(EVENT, DONE)
    raw = start_raw(writes(*pieces))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    first = json.dumps({**ask, "user": "one"}).encode()
    second = json.dumps({**ask, "user": "two"}).encode()
    data = _request(gateway, first) + _request(gateway, second)
    one, two = _wire(gateway.server.port, data, 2)
    got = [
        _audited(gateway, tmp_path, vkey, one, first),
        _audited(gateway, tmp_path, vkey, two, second),
    ]
    assert got[0].headers["x-request-id"] != got[1].headers["x-request-id"]
    swapped = replace(got[1], request=first)
    assert "the request commitment does not open with the bytes sent" in audit(
        swapped, tmp_path / "log", vkey
    )


def test_an_http_1_0_stream_ended_by_the_close_is_logged_as_received(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    raw = start_raw(writes(*chunked(EVENT, DONE)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    sent = json.dumps(CHAT).encode()
    (answer,) = _wire(gateway.server.port, _request(gateway, sent, version=b"HTTP/1.0"), 1)
    received = _audited(gateway, tmp_path, vkey, answer, sent)
    assert received.status == 200 and received.body.startswith(EVENT + DONE)
