"""What a hostile backend can make a client see, on the client's own keep-alive connection.

A private backend writes raw bytes (tests/helpers/raw_backend.py): headers named as the
gateway's own in any case, cookies, CORS and HSTS, hop-by-hop fields, interim and
switching responses, bodies on 204/304, framing that disagrees with itself, odd status
lines, SSE fields and `owngate-` comments hidden behind others. For each, the client's
answer carries only the gateway's headers, its next request on the same connection gets
its own answer (no response smuggling), and the signed log says what the client got.
The other way round, none of the client's headers (its gateway key, hop-by-hop and proxy
fields, forwarding headers, its host) reaches a private backend or a hosted provider.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httptools
import pytest

from tests.helpers.audit_rig import (
    ANSWER,
    HOSTED_ANSWER,
    HOSTED_ASK,
    JSON,
    WHOLE,
    chunked,
    hosted_gateway,
    later_receipt,
    logged,
    settled,
    whole_answer,
)
from tests.helpers.gateways import LITELLM_WARNINGS, Gateway, backend
from tests.helpers.independent_audit import Received, audit
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_response

pytestmark = LITELLM_WARNINGS

# The only header names a client gets on a relayed answer: the gateway writes them all.
GATEWAY_HEADERS = {
    b"content-type",
    b"content-length",
    b"transfer-encoding",
    b"cache-control",
    b"x-request-id",
    b"x-owngate-receipt",
}
# What a backend writes to pass for the gateway, or to act on the gateway's origin.
FORGED = (
    b"X-OwnGate-Receipt: e30=",
    b"x-owngate-receipt: e30=",
    b"x-owngate-backend: evil-gpu",
    b"X-Request-Id: req_000000000000000000000000",
    b"set-cookie: sid=evil; Path=/",
    b"Set-Cookie: sid=evil2",
    b"strict-transport-security: max-age=0",
    b"access-control-allow-origin: *",
    b"access-control-allow-credentials: true",
    b"location: http://evil.example/",
    b"retry-after: 99999",
    b"openai-organization: evil-org",
    b"keep-alive: timeout=1",
    b"connection: x-request-id, content-type",
    b"trailer: x-owngate-receipt",
)
_EVIL = (b"evil", b"e30=", b"req_000000000000000000000000", b"99999")
_LENGTH = len(ANSWER)
# A usage-only chunk, as OpenAI sends it when asked (`stream_options.include_usage`).
USAGE_EVENT = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
)
_TE_CL = b"HTTP/1.1 200 OK\r\n%s\r\ncontent-length: 10\r\n%s\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"

WHOLE_CASES: dict[str, bytes] = {
    "forged-headers": whole_answer(200, ANSWER, JSON, *FORGED),
    "forged-on-a-redirect": whole_answer(302, ANSWER, JSON, *FORGED),
    "forged-on-an-error": whole_answer(
        400, b'{"error":{"message":"no","type":"x"}}', JSON, *FORGED
    ),
    "folded-header": whole_answer(200, ANSWER, JSON, b"x-a: b\r\n x-owngate-receipt: e30="),
    "100-and-103-first": b"HTTP/1.1 100 Continue\r\nset-cookie: sid=evil\r\n\r\n"
    + b"HTTP/1.1 103 Early Hints\r\nx-owngate-receipt: e30=\r\nlink: <http://evil>\r\n\r\n"
    + whole_answer(200, ANSWER, JSON),
    "101-switching": b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
    b"connection: upgrade\r\n\r\n" + whole_answer(200, ANSWER, JSON),
    "200-with-upgrade": whole_answer(
        200, ANSWER, JSON, b"connection: upgrade", b"upgrade: websocket"
    ),
    "204-with-a-body": b"HTTP/1.1 204 No Content\r\ncontent-length: %d\r\n%s\r\n\r\n%s"
    % (_LENGTH, JSON, ANSWER),
    "304-with-a-body": b"HTTP/1.1 304 Not Modified\r\ncontent-length: %d\r\n%s\r\n\r\n%s"
    % (_LENGTH, JSON, ANSWER),
    "http-1.0-close-ended": b"HTTP/1.0 200 OK\r\n" + JSON + b"\r\n\r\n" + ANSWER,
    "status-600": whole_answer(600, ANSWER, JSON),
    "odd-reason": whole_answer(200, ANSWER, JSON).replace(b" X\r\n", b" \x01\x7f\xff:\r\n", 1),
    "two-content-lengths": b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\ncontent-length: 10\r\n"
    b"%s\r\n\r\n%s" % (_LENGTH, JSON, ANSWER),
    "chunked-and-length": _TE_CL % (b"transfer-encoding: chunked", JSON, _LENGTH, ANSWER),
    "Chunked-and-length": _TE_CL % (b"Transfer-Encoding: Chunked", JSON, _LENGTH, ANSWER),
    "length-short-of-body": b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n%s\r\n\r\n%s"
    % (JSON, ANSWER),
    "a-second-answer-after": whole_answer(200, ANSWER, JSON, b"connection: keep-alive")
    + whole_answer(200, b'{"smuggled":true}', JSON, *FORGED),
}


def _first_then_plain(first: bytes) -> Answer:
    """`first` to the first request, a plain completion saying "second" to every other."""
    answered: list[Post] = []

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        answered.append(post)
        writer.write(first if len(answered) == 1 else completion_response("second"))
        await writer.drain()
        return False

    return answer


class _Answers:
    """httptools callbacks: the responses read off one client connection."""

    def __init__(self) -> None:
        self.heads: list[list[tuple[bytes, bytes]]] = []
        self.bodies: list[bytes] = []
        self.statuses: list[int] = []
        self.done = 0
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.heads.append([])
        self.bodies.append(b"")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.heads[-1].append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.bodies[-1] += body

    def on_message_complete(self) -> None:
        self.done += 1


def _post(gateway: Gateway, ask: dict[str, Any], *extra: bytes) -> bytes:
    body = json.dumps(ask).encode()
    head = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"host: gateway.test",
        b"authorization: Bearer " + gateway.key.encode(),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        *extra,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _two_on_one_connection(gateway: Gateway, ask: dict[str, Any]) -> _Answers:
    """The answers to `ask` and then a plain chat request, sent one after the other on one
    keep-alive connection (each sent once the answer before it ended)."""
    answers = _Answers()
    port = int(gateway.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        for number, request in enumerate((_post(gateway, ask), _post(gateway, WHOLE))):
            sock.sendall(request)
            while answers.done <= number:
                data = sock.recv(1 << 16)
                assert data, f"the gateway closed the connection after {answers.done} answers"
                answers.parser.feed_data(data)
    assert answers.done == 2
    return answers


def _check(
    answers: _Answers, gateway: Gateway, tmp_path: Path, vkey: str, ask: dict[str, Any]
) -> None:
    """The first answer has the gateway's headers only, the second is the plain request's
    own, and the log says what the client got of the first."""
    first = answers.heads[0]
    names = [name for name, _ in first]
    assert set(names) <= GATEWAY_HEADERS, names
    assert names.count(b"x-request-id") == 1
    assert names.count(b"x-owngate-receipt") <= 1
    values = b" ".join(value for _, value in first)
    assert not [evil for evil in _EVIL if evil in values.lower()], values
    assert answers.statuses[1] == 200
    assert json.loads(answers.bodies[1])["choices"][0]["message"]["content"] == "second"
    second_id = dict(answers.heads[1])[b"x-request-id"]
    request_id = dict(first)[b"x-request-id"].decode()
    assert second_id.decode() != request_id
    headers = {name.decode(): value.decode("latin-1") for name, value in first}
    received = Received(answers.statuses[0], headers, answers.bodies[0], json.dumps(ask).encode())
    settled(tmp_path / "log", vkey, request_id)
    later = later_receipt(gateway, request_id)
    assert audit(received, tmp_path / "log", vkey, later_receipt=later) == []


@pytest.mark.parametrize("case", list(WHOLE_CASES))
def test_a_hostile_whole_answer_leaves_the_clients_connection_in_step(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    raw = start_raw(_first_then_plain(WHOLE_CASES[case]))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    answers = _two_on_one_connection(gateway, WHOLE)
    _check(answers, gateway, tmp_path, vkey, WHOLE)
    assert b"smuggled" not in b"".join(answers.bodies)


def _chunked_stream(*events: bytes, head: tuple[bytes, ...] = ()) -> bytes:
    first, *rest = chunked(*events)
    if head:
        first = first.replace(b"\r\n\r\n", b"\r\n" + b"\r\n".join(head) + b"\r\n\r\n", 1)
    return first + b"".join(rest)


STREAM_CASES: dict[str, bytes] = {
    "forged-headers": _chunked_stream(EVENT, DONE, head=FORGED),
    "sse-fields": _chunked_stream(b"id: 7\nretry: 1\nevent: message\n" + EVENT, DONE),
    "comment-variants": _chunked_stream(
        b": OwnGate-receipt e30=\n\n",
        b":\t owngate-receipt e30=\r: owngate-attest e30=\r\n",
        EVENT,
        b": own",
        b"gate-receipt e30=\n",
        DONE,
    ),
    "cr-line-ends": _chunked_stream(
        EVENT.replace(b"\n", b"\r"), b": owngate-receipt e30=\r\r", DONE.replace(b"\n", b"\r")
    ),
    "long-comment-line": _chunked_stream(b": " + b"x" * 300_000 + b"\n\n", EVENT, DONE),
    # A removed comment line at the stream's start puts the next line first: a client's
    # SSE parser skips a BOM there, and reads the line after it as a comment.
    "bom-behind-a-removed-comment": _chunked_stream(
        b": owngate-x\n\xef\xbb\xbf: owngate-receipt e30=\n\n", EVENT, DONE
    ),
    "bom-behind-two-removed-comments": _chunked_stream(
        b": owngate-x\r\n",
        b":OWNGATE-y\r",
        b"\xef\xbb\xbf:\towngate-attest e30=\n\n",
        EVENT,
        DONE,
    ),
    # The usage-only chunk the gateway asked for, which the client did not, is held back
    # from it (gateway/api/sse.py) after the comment filter ran: the line behind it is the
    # first the client gets, where its parser skips a BOM.
    "bom-behind-a-held-back-usage-chunk": _chunked_stream(
        USAGE_EVENT, b"\xef\xbb\xbf: owngate-receipt e30=\n\n", EVENT, DONE
    ),
}


def _comment_lines(stream: bytes) -> list[bytes]:
    """The `owngate-` comment lines an SSE parser (WHATWG: LF, CRLF or CR line ends, a BOM
    skipped at the stream's start) reads in `stream`."""
    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    lines = re.split(rb"\r\n|\r|\n", stream)
    return [
        line
        for line in lines
        if line.startswith(b":") and line[1:].lstrip(b" \t").lower().startswith(b"owngate-")
    ]


@pytest.mark.parametrize("case", list(STREAM_CASES))
def test_a_hostile_stream_shows_the_client_only_the_gateways_receipt_line(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    raw = start_raw(_first_then_plain(STREAM_CASES[case]))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    answers = _two_on_one_connection(gateway, CHAT)
    assert answers.statuses[0] == 200
    lines = _comment_lines(answers.bodies[0])
    assert len(lines) == 1, lines
    assert lines[0].startswith(b": owngate-receipt ")
    assert b"e30=" not in lines[0]
    _check(answers, gateway, tmp_path, vkey, CHAT)


# Client headers no backend may get: the gateway key, hop-by-hop fields (and one that
# `Connection` names), proxy and forwarding fields, cookies, the client's own ids.
CLIENT_EXTRA = (
    b"connection: keep-alive, x-hop, authorization",
    b"x-hop: canary-hop",
    b"te: trailers",
    b"upgrade: h2c",
    b"proxy-authorization: Basic canary-proxy",
    b"proxy-connection: keep-alive",
    b"keep-alive: timeout=5",
    b"x-forwarded-for: 203.0.113.9",
    b"x-forwarded-host: canary-host",
    b"x-forwarded-proto: canary-proto",
    b"forwarded: for=203.0.113.9;host=canary-host",
    b"x-real-ip: 203.0.113.9",
    b"via: 1.1 canary-via",
    b"cookie: sid=canary-cookie",
    b"openai-organization: canary-org",
    b"openai-project: canary-project",
    b"x-owngate-salts: canary-salts",
    b"x-request-id: req_111111111111111111111111",
    b"x-litellm-api-key: canary-litellm",
    b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    b"user-agent: canary-agent",
)


def _sent_upstream(gateway: Gateway, raw: RawBackend, ask: dict[str, Any]) -> bytes:
    """The head of the request the backend got for `ask` sent with `CLIENT_EXTRA`."""
    port = int(gateway.url.rsplit(":", 1)[1])
    answers = _Answers()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(_post(gateway, ask, *CLIENT_EXTRA))
        while not answers.done:
            data = sock.recv(1 << 16)
            assert data, "the gateway closed the connection without an answer"
            answers.parser.feed_data(data)
    assert answers.statuses == [200], answers.bodies
    assert len(raw.posts) == 1
    return raw.posts[0].head.lower()


def _assert_no_client_header(head: bytes, gateway: Gateway) -> None:
    assert gateway.key.lower().encode() not in head
    for canary in (b"canary", b"203.0.113.9", b"req_111111111111111111111111"):
        assert canary not in head, head
    for name in (b"te", b"upgrade", b"x-hop", b"cookie", b"forwarded", b"via", b"traceparent"):
        assert b"\r\n" + name + b":" not in head, head
    assert b"\r\nhost: gateway.test" not in head


def test_no_client_header_reaches_a_private_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    raw = start_raw(_first_then_plain(completion_response("hi")))
    gateway, _ = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    _assert_no_client_header(_sent_upstream(gateway, raw, WHOLE), gateway)


def test_no_client_header_reaches_a_hosted_provider(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    raw = start_raw(_first_then_plain(whole_answer(200, HOSTED_ANSWER, JSON)))
    gateway, _ = hosted_gateway(start_gateway, tmp_path, raw.url)
    head = _sent_upstream(gateway, raw, {**HOSTED_ASK, "stream": False})
    _assert_no_client_header(head, gateway)
    assert b"authorization: bearer sk-test" in head  # the provider's key, the only one
