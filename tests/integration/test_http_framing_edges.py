"""HTTP/1.1 framing edges on every listener owngate runs: the public one, the admin API's
(both `gateway.listener`) and the `owngate attest` sidecar's (`gateway.attest.reader`),
over raw sockets.

- A Transfer-Encoding other than `chunked` alone is 400 (llhttp read `identity, chunked`
  or `gzip, chunked` as plain chunked: the body never decoded, where a proxy in front may
  have framed it otherwise), and so is any Transfer-Encoding on an HTTP/1.0 request
  (RFC 9112, section 6.1).
- An answer of unknown length (a stream) to an HTTP/1.0 request carries no
  `transfer-encoding: chunked` (its client reads the chunk-size lines as body): it is
  sent as it is and ends with the connection, as nginx sends it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import admin_server, create_app
from gateway.attest import AttestSettings, AttestThread
from gateway.provenance import write_signing_key
from gateway.serving import ServerThread
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.raw_socket import Server, assert_refused, exchange, parse

CHAT = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'
STREAM = (
    b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], '
    b'"max_tokens": 3, "stream": true}'
)
KINDS = ["public", "admin", "sidecar"]


@pytest.fixture
def start_listener(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[Callable[[str], Server]]:
    """One of the three listeners, in front of a zero-latency simulator."""
    stops: list[Callable[[], None]] = []
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)

    def start(kind: str) -> Server:
        if kind == "sidecar":
            key = tmp_path / "sidecar.key"
            write_signing_key(key, "sidecar")
            settings = AttestSettings(backend=sim.url, key_file=key, log_dir=tmp_path / "log")
            sidecar = AttestThread(settings).start()
            stops.append(sidecar.stop)
            return sidecar
        config = gateway_config([backend("gpu", sim.url, "sim-model")])
        app = create_app(config, environ={})
        if kind == "public":
            server = ServerThread(app, listen=config.listen)
        else:  # the admin API's app on its own protocol class (`admin_server`)
            admin = admin_server(app).config
            server = ServerThread(admin.app, http=admin.http)
        stops.append(server.stop)
        return server.start()

    yield start
    for stop in stops:
        stop()


def _post(body: bytes, version: bytes = b"1.1", framing: bytes = b"") -> bytes:
    """A chat completion request; `framing` replaces its content-length line."""
    framing = framing or b"content-length: %d\r\n" % len(body)
    return (
        b"POST /v1/chat/completions HTTP/%s\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\n%sconnection: close\r\n\r\n"
        % (version, TENANT_KEY.encode(), framing)
    )


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "coding",
    [b"identity, chunked", b"gzip, chunked", b"identity\r\ntransfer-encoding: chunked"],
    ids=["identity-chunked", "gzip-chunked", "two-lines"],
)
def test_a_transfer_coding_other_than_chunked_alone_is_400(
    start_listener: Callable[[str], Server], kind: str, coding: bytes
) -> None:
    server = start_listener(kind)
    framing = b"transfer-encoding: %s\r\n" % coding
    raw = exchange(server, _post(CHAT, framing=framing) + _chunked(CHAT))
    error = assert_refused(raw, 400, "invalid_request")
    assert error["message"].startswith("Transfer-Encoding must be exactly chunked")


@pytest.mark.parametrize("kind", KINDS)
def test_transfer_encoding_on_an_http_1_0_request_is_400(
    start_listener: Callable[[str], Server], kind: str
) -> None:
    server = start_listener(kind)
    raw = exchange(server, _post(CHAT, b"1.0", b"transfer-encoding: chunked\r\n") + _chunked(CHAT))
    error = assert_refused(raw, 400, "invalid_request")
    assert "HTTP/1.0" in error["message"]


def test_chunked_alone_is_still_served(start_listener: Callable[[str], Server]) -> None:
    """`chunked` in any case, with spaces or an empty list element, is chunked alone."""
    server = start_listener("public")
    for coding in (b"chunked", b"Chunked", b" chunked ", b", chunked"):
        framing = b"transfer-encoding: %s\r\n" % coding
        status, _, body = parse(exchange(server, _post(CHAT, framing=framing) + _chunked(CHAT)))
        assert status == 200, body
        assert json.loads(body)["object"] == "chat.completion"


def _unframed_stream(raw: bytes) -> tuple[dict[str, str], bytes]:
    """The headers and body of a 200 stream ended by the server's close."""
    status, headers, body = parse(raw)
    assert status == 200, raw[:300]
    assert "transfer-encoding" not in headers
    assert "content-length" not in headers
    assert headers["connection"] == "close"
    return headers, body


@pytest.mark.parametrize("kind", ["public", "sidecar"])
def test_a_stream_to_an_http_1_0_client_is_not_chunked(
    start_listener: Callable[[str], Server], kind: str
) -> None:
    server = start_listener(kind)
    raw = exchange(server, _post(STREAM, b"1.0") + STREAM)
    headers, body = _unframed_stream(raw)
    assert headers["content-type"].startswith("text/event-stream")
    # Events as the backend sent them, no chunk-size line before the first one.
    assert body.startswith(b"data: {")
    assert b"data: [DONE]" in body
    # Over HTTP/1.1 the same stream is chunked.
    status, headers, body = parse(exchange(server, _post(STREAM) + STREAM))
    assert (status, headers["transfer-encoding"]) == (200, "chunked")
    assert not body.startswith(b"data:")


def test_a_whole_answer_to_an_http_1_0_client_keeps_its_length(
    start_listener: Callable[[str], Server],
) -> None:
    server = start_listener("public")
    status, headers, body = parse(exchange(server, _post(CHAT, b"1.0") + CHAT))
    assert status == 200
    assert int(headers["content-length"]) == len(body)
    assert "transfer-encoding" not in headers
    assert json.loads(body)["object"] == "chat.completion"


def test_an_app_stream_to_an_http_1_0_client_ends_with_the_connection() -> None:
    """Any answer without a length, even one naming chunked itself, goes unframed."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"text/plain"), (b"transfer-encoding", b"chunked")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    with ServerThread(app) as server:
        _, body = _unframed_stream(exchange(server, b"GET / HTTP/1.0\r\n\r\n"))
        assert body == b"one two three"
        head = exchange(server, b"HEAD / HTTP/1.0\r\n\r\n")
        assert parse(head)[2] == b""
