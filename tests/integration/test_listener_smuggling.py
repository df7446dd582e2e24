"""Request smuggling against owngate's own listeners, over raw sockets: every framing a
proxy in front might read differently from the gateway is refused, never guessed at.

Each request is followed on its connection by a second one (`GET /smuggled`): whatever
the framing, exactly one answer comes back (a 400 OpenAI error object with
`connection: close`), so nothing the client hid in a body is ever parsed as a request
of its own. Run against the gateway's public listener (`gateway/listener.py`) and the
`owngate attest` sidecar's (`gateway/attest/reader.py`), which parse alike.
"""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from gateway.app import create_app
from gateway.attest import AttestSettings, AttestThread
from gateway.config.schema import ListenSettings
from gateway.provenance import write_signing_key
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_socket import Server, assert_refused, exchange, parse

BODY = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}'
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n"
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)


@dataclasses.dataclass
class Address:
    """Where a server in another process listens (`raw_socket.Server`)."""

    host: str
    port: int


def _post(fields: bytes, body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"
        b"content-type: application/json\r\n" + fields + b"\r\n" + body
    )


def _chunked(body: bytes) -> bytes:
    return _post(b"transfer-encoding: chunked\r\n", body)


def _version(version: bytes, fields: bytes, body: bytes) -> bytes:
    return _post(fields, body).replace(b" HTTP/1.1\r\n", b" " + version + b"\r\n", 1)


# llhttp parses these request lines with headers, keep-alive and a chunked body; a proxy
# reads an HTTP/0.9 request as ending with its request line, and answers 505 to HTTP/2.0.
OTHER_VERSIONS = {
    "http-0.9-chunked": _version(b"HTTP/0.9", b"transfer-encoding: chunked\r\n", CHUNKED),
    "http-0.9-length": _version(b"HTTP/0.9", b"content-length: %d\r\n" % len(BODY), BODY),
    "http-2.0-chunked": _version(b"HTTP/2.0", b"transfer-encoding: chunked\r\n", CHUNKED),
    "http-2.0-keep-alive": _version(
        b"HTTP/2.0", b"connection: keep-alive\r\ncontent-length: %d\r\n" % len(BODY), BODY
    ),
}

AMBIGUOUS = {
    "cl-and-te": _post(b"content-length: 5\r\ntransfer-encoding: chunked\r\n", CHUNKED),
    "te-and-cl": _post(b"transfer-encoding: chunked\r\ncontent-length: 5\r\n", CHUNKED),
    "two-lengths": _post(b"content-length: %d\r\ncontent-length: 3\r\n" % len(BODY), BODY),
    "same-length-twice": _post(b"content-length: 70\r\ncontent-length: 70\r\n", BODY),
    "length-list": _post(b"content-length: 70, 70\r\n", BODY),
    "length-plus": _post(b"content-length: +70\r\n", BODY),
    "length-negative": _post(b"content-length: -1\r\n", BODY),
    "chunked-then-identity": _post(b"transfer-encoding: chunked, identity\r\n", CHUNKED),
    "identity-only": _post(b"transfer-encoding: identity\r\n", BODY),
    # llhttp reads these as chunked (the last coding is), the codings before never undone
    "identity-then-chunked": _post(b"transfer-encoding: identity, chunked\r\n", CHUNKED),
    "gzip-then-chunked": _post(b"transfer-encoding: gzip, chunked\r\n", CHUNKED),
    "identity-line-then-chunked": _post(
        b"transfer-encoding: identity\r\ntransfer-encoding: chunked\r\n", CHUNKED
    ),
    "te-on-http-1.0": _post(b"transfer-encoding: chunked\r\n", CHUNKED).replace(
        b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1
    ),
    "chunked-twice": _post(
        b"transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n", CHUNKED
    ),
    "te-space-before-colon": _post(b"transfer-encoding : chunked\r\n", CHUNKED),
    "te-obs-fold": _post(b"transfer-encoding:\r\n chunked\r\n", CHUNKED),
    "obs-fold": _post(b"content-length: %d\r\nx-data-class: public\r\n phi\r\n" % len(BODY), BODY),
    "chunk-size-plus": _chunked(b"+%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
    "chunk-size-0x": _chunked(b"0x%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
    "chunk-size-space": _chunked(b"%x \r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
    "chunk-size-overflow": _chunked(b"1" + b"0" * 24 + b"\r\nabc"),
    "chunk-bare-lf": _chunked(b"%x\n%s\n0\n\n" % (len(BODY), BODY)),
    "chunk-data-too-long": _chunked(b"%x\r\n%sXX\r\n0\r\n\r\n" % (len(BODY), BODY)),
    "bare-lf-head": _post(b"content-length: %d\r\n" % len(BODY), BODY).replace(b"\r\n", b"\n"),
    "bare-cr-head": _post(b"content-length: %d\r\n" % len(BODY), BODY).replace(
        b"host: x\r\n", b"host: x\r"
    ),
    "nul-in-value": _post(b"content-length: %d\r\nx-data-class: ph\x00i\r\n" % len(BODY), BODY),
    "esc-in-value": _post(b"content-length: %d\r\nx-a: \x1b[31m\r\n" % len(BODY), BODY),
    "del-in-value": _post(b"content-length: %d\r\nx-a: a\x7f\r\n" % len(BODY), BODY),
    "space-in-name": _post(b"content-length: %d\r\nx a: b\r\n" % len(BODY), BODY),
    "h2c-upgrade": b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: upgrade, http2-settings\r\n"
    b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    "connect": b"CONNECT evil.example:443 HTTP/1.1\r\nhost: evil.example\r\n\r\n",
    **OTHER_VERSIONS,
}


@pytest.fixture
def public_process(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[GatewayProcess]:
    """A real `owngate serve` in front of one simulator."""
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "error", "access_log": False},
        "backends": [backend("gpu", sim.url, "sim-model")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}],
    }
    gateway = GatewayProcess(config, tmp_path).start()
    yield gateway
    gateway.stop()


@pytest.fixture
def public(start_sim: Callable[..., Sim]) -> Iterator[ServerThread]:
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
    config = gateway_config([backend("gpu", sim.url, "sim-model")])
    server = ServerThread(create_app(config, environ={}), listen=config.listen).start()
    yield server
    server.stop()


@pytest.fixture
def sidecar(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[AttestThread]:
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
    write_signing_key(tmp_path / "sidecar.key", "sidecar")
    settings = AttestSettings(backend=sim.url, key_file=tmp_path / "sidecar.key", log_dir=tmp_path)
    server = AttestThread(settings, listen=ListenSettings())
    server.start()
    yield server
    server.stop()


def _one_refusal(server: Server, request: bytes) -> None:
    raw = exchange(server, request + SMUGGLED)
    assert raw.count(b"HTTP/1.1 ") == 1, raw[:400]  # the smuggled request never ran
    assert_refused(raw, 400, "invalid_request")


@pytest.mark.parametrize("request_bytes", AMBIGUOUS.values(), ids=AMBIGUOUS.keys())
def test_the_public_listener_refuses_ambiguous_framing(
    public: ServerThread, request_bytes: bytes
) -> None:
    _one_refusal(public, request_bytes)


def test_owngate_serve_refuses_other_http_versions(
    public_process: GatewayProcess,
) -> None:
    """The same refusals from a real `owngate serve`: an HTTP/0.9 or HTTP/2.0 request
    line is 400 with nothing after it parsed as a request (each was served, the HTTP/2.0
    one keeping the connection open for the request after it)."""
    server = Address("127.0.0.1", public_process.port)
    for name, request_bytes in OTHER_VERSIONS.items():
        raw = exchange(server, request_bytes + SMUGGLED)
        assert raw.count(b"HTTP/1.1 ") == 1, (name, raw[:400])
        assert_refused(raw, 400, "invalid_request")


@pytest.mark.parametrize("request_bytes", AMBIGUOUS.values(), ids=AMBIGUOUS.keys())
def test_the_sidecar_refuses_ambiguous_framing(sidecar: AttestThread, request_bytes: bytes) -> None:
    _one_refusal(sidecar, request_bytes.replace(b"/v1/chat/completions", b"/v1/completions"))


# RFC 9112 section 3.2: a request with more than one Host field is 400 (a proxy in front
# may route on one, a backend read the other); each was served.
REPEATED_HOST = {
    "two-hosts": _post(b"host: y\r\ncontent-length: %d\r\n" % len(BODY), BODY),
    "same-host-twice": _post(b"host: x\r\ncontent-length: %d\r\n" % len(BODY), BODY),
    "two-hosts-http-1.0": _version(
        b"HTTP/1.0", b"host: y\r\ncontent-length: %d\r\n" % len(BODY), BODY
    ),
}
# A body in a content coding was read as plain JSON, the header dropped: 415, so nothing
# reads the body otherwise than the gateway checked it.
GZIP_BODY = gzip.compress(BODY)
CONTENT_CODED = {
    "gzip": _post(b"content-encoding: gzip\r\ncontent-length: %d\r\n" % len(GZIP_BODY), GZIP_BODY),
    "gzip-plain-body": _post(b"content-encoding: gzip\r\ncontent-length: %d\r\n" % len(BODY), BODY),
    "identity-then-br": _post(
        b"content-encoding: identity, br\r\ncontent-length: %d\r\n" % len(BODY), BODY
    ),
    "deflate-second-line": _post(
        b"content-encoding: identity\r\ncontent-encoding: DEFLATE\r\ncontent-length: %d\r\n"
        % len(BODY),
        BODY,
    ),
}


def test_owngate_serve_refuses_a_repeated_host(public_process: GatewayProcess) -> None:
    """A real `owngate serve`: two Host fields are 400 `invalid_request`, and nothing
    after them on the connection runs; one Host is served."""
    server = Address("127.0.0.1", public_process.port)
    for name, request_bytes in REPEATED_HOST.items():
        raw = exchange(server, request_bytes + SMUGGLED)
        assert raw.count(b"HTTP/1.1 ") == 1, (name, raw[:400])
        error = assert_refused(raw, 400, "invalid_request")
        assert "Host" in error["message"], name
    served = exchange(
        server, _post(b"content-length: %d\r\nconnection: close\r\n" % len(BODY), BODY)
    )
    assert served.startswith(b"HTTP/1.1 200 "), served[:300]


def test_owngate_serve_refuses_a_content_coded_body(public_process: GatewayProcess) -> None:
    """A real `owngate serve`: a request body in any content coding but identity is 415
    `unsupported_media_type`, nothing after it runs; `identity` is served."""
    server = Address("127.0.0.1", public_process.port)
    for name, request_bytes in CONTENT_CODED.items():
        raw = exchange(server, request_bytes + SMUGGLED)
        assert raw.count(b"HTTP/1.1 ") == 1, (name, raw[:400])
        assert_refused(raw, 415, "unsupported_media_type")
    identity = b"content-encoding: identity\r\ncontent-length: %d\r\nconnection: close\r\n"
    served = exchange(server, _post(identity % len(BODY), BODY))
    assert served.startswith(b"HTTP/1.1 200 "), served[:300]


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        *((r, 400, "invalid_request") for r in REPEATED_HOST.values()),
        *((r, 415, "unsupported_media_type") for r in CONTENT_CODED.values()),
    ],
    ids=[*REPEATED_HOST, *CONTENT_CODED],
)
def test_the_sidecar_refuses_a_repeated_host_and_a_content_coded_body(
    sidecar: AttestThread, request_bytes: bytes, status: int, code: str
) -> None:
    raw = exchange(
        sidecar, request_bytes.replace(b"/v1/chat/completions", b"/v1/completions") + SMUGGLED
    )
    assert raw.count(b"HTTP/1.1 ") == 1, raw[:400]
    assert_refused(raw, status, code)


# Bytes after a whole request that are no request head: the request is answered first,
# then the bytes are refused (400, `connection: close`), as nginx answers them.
TRAILING = {
    "json-after-length-0": (_post(b"content-length: 0\r\n", BODY), 400),
    "junk-after-request": (_post(b"content-length: %d\r\n" % len(BODY), BODY) + b"{}\r\n\r\n", 200),
    "body-twice": (_post(b"content-length: %d\r\n" % len(BODY), BODY) + BODY, 200),
    "bad-version-after-request": (
        _post(b"content-length: %d\r\n" % len(BODY), BODY) + _version(b"HTTP/2.0", b"", b""),
        200,
    ),
}


@pytest.mark.parametrize(("request_bytes", "first"), TRAILING.values(), ids=TRAILING.keys())
def test_a_request_with_bytes_after_it_that_are_no_request_is_answered_first(
    public: ServerThread, request_bytes: bytes, first: int
) -> None:
    """The answer to the request goes out before the refusal of what follows it, and
    nothing after them runs. The connection used to be closed at once, the first answer
    unsent: a request with a body after `Content-Length: 0` got no answer at all, and a
    whole one with a stray byte after its body none either (recorded as a client that
    left, 499)."""
    raw = exchange(public, request_bytes + SMUGGLED)
    status, headers, body = parse(raw)
    assert status == first, raw[:300]
    rest, body = body[int(headers["content-length"]) :], body[: int(headers["content-length"])]
    if first == 200:
        assert orjson.loads(body)["object"] == "chat.completion"
    else:
        assert orjson.loads(body)["error"]["code"] == "invalid_json"
    assert rest.count(b"HTTP/1.1 ") == 1, rest[:400]  # the smuggled request never ran
    assert_refused(rest, 400, "invalid_request")
