"""The relay (`gateway.attest.app.AttestRelay`) over a raw loopback backend: an answer the
backend ends by closing the connection (no content-length, not chunked) may be one cut
short by the backend dying, so it is never countersigned, and a stream keeps that
framing, so the gateway applies its own check (`[DONE]`) as it would without the
sidecar."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from pathlib import Path

import httptools
import pytest

from gateway.api.attested import SseTail
from gateway.attest import AttestRelay, AttestSettings
from gateway.attest.protocol import Listener
from gateway.provenance import Salts, commit, load_signer, write_signing_key
from gateway.provenance.formats.attestation import check_countersignature, salts_value
from tests.helpers.comment_feeds import fed_sizes
from tests.helpers.fake_transport import LIMITS, WAIT_S, FakeTransport
from tests.helpers.provenance import records
from tests.helpers.raw_socket import parse

_CHAT = b'{"model": "m", "messages": []}'
_POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_CHAT), _CHAT)
)


async def _relay_once(
    tmp_path: Path,
    answer: bytes,
    request: bytes = _POST,
    *,
    close: bool = True,
    random: Callable[[int], bytes] = os.urandom,
) -> bytes:
    """What the sidecar writes to its client for one `request` whose backend sends
    `answer` and then closes the connection (or, not `close`, keeps it open)."""

    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        if close:
            writer.close()
        else:
            await reader.read()  # until the sidecar closes

    server = await asyncio.start_server(backend, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    relay = AttestRelay(
        AttestSettings(backend=f"http://127.0.0.1:{port}", key_file=key, log_dir=tmp_path / "log"),
        random=random,
    )
    assert await relay.open() is None
    try:
        connection = Listener(relay, LIMITS, 4096, keepalive_s=30.0).protocol()
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(request)
        assert connection.task is not None
        await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)
        return bytes(transport.written)
    finally:
        await relay.close()
        server.close()


@pytest.mark.parametrize(
    "answer",
    [
        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"choices": [{"mess',
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {}\n\n",
    ],
    ids=["whole", "stream"],
)
def test_an_answer_ended_by_the_backend_closing_is_not_countersigned(
    tmp_path: Path, answer: bytes
) -> None:
    written = asyncio.run(_relay_once(tmp_path, answer))
    assert written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"owngate-attest" not in written


def test_a_stream_ended_by_the_backend_closing_keeps_its_framing(tmp_path: Path) -> None:
    """No chunked end that would tell the gateway the stream is whole: it reads the close
    as the backend's, and checks for `[DONE]` as it does without the sidecar."""
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {}\n\n"
    written = asyncio.run(_relay_once(tmp_path, answer))
    head, _, body = written.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower()
    assert b"connection: close" in head.lower()
    assert body == b"data: {}\n\n"


def test_a_streams_large_read_is_relayed_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar's comment filter costs Python per comment line: a read of 256 KiB of
    them held its event loop some 0.25 s. Each read is taken in pieces of at most 16 KiB
    (`PIECE`, gateway/upstream/response.py), the loop turning between them."""
    fed = fed_sizes(monkeypatch)
    burst = b": owngate-x\n" * (1024 * 1024 // 12) + b"data: [DONE]\n\n"
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + burst
    written = asyncio.run(_relay_once(tmp_path, answer))
    assert written.split(b"\r\n\r\n", 1)[1] == b"data: [DONE]\n\n"
    assert sum(fed) == len(burst)
    assert max(fed) <= 16 * 1024, max(fed)  # was a read's whole, up to 256 KiB


def test_a_whole_answers_comment_lines_are_walked_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So is a whole answer it countersigns: its comment lines, walked in one go (a
    16 MiB answer of them held the loop 3.4 s of CPU), are walked 16 KiB at a time."""
    fed = fed_sizes(monkeypatch)
    body = b": owngate-x\n" * (1024 * 1024 // 12) + b'{"a": 1}'
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    written = asyncio.run(_relay_once(tmp_path, answer % len(body) + body))
    assert written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b'\r\n\r\n{"a": 1}' in written
    assert sum(fed) == len(body)
    assert max(fed) <= 16 * 1024, max(fed)  # was the whole answer


@pytest.mark.parametrize("method", [b"HEAD", b"OPTIONS", b"DELETE"])
def test_methods_other_than_get_and_post_are_refused(tmp_path: Path, method: bytes) -> None:
    """The relay does not tell the answer's parser that the request was HEAD, which has
    no body whatever its content-length says: a HEAD would hold a backend connection
    until the read timeout. The sidecar relays what a gateway sends: GET and POST."""
    request = method + b" /health HTTP/1.1\r\nhost: x\r\n\r\n"
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 10\r\n\r\n"
    written = asyncio.run(_relay_once(tmp_path, answer, request, close=False))
    status, headers, body = parse(written)
    assert status == 405
    assert headers["allow"] == "GET, POST"
    if method == b"HEAD":  # its head alone: body bytes would start the next answer
        assert body == b""
        assert int(headers["content-length"]) > 0
    else:
        assert json.loads(body)["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 204 No Content\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\ncontent-type: text/event-stream\r\n\r\n",
    ],
    ids=["204-chunked", "304"],
)
def test_an_answer_without_a_body_gets_no_body(tmp_path: Path, answer: bytes) -> None:
    """A 204 or 304 has no body whatever its headers say: the stream (a chunked body, or
    the final comment after the head) that the sidecar wrote after it was, to the
    gateway's parser, the start of the next response on that connection."""
    written = asyncio.run(_relay_once(tmp_path, answer))
    head, _, rest = written.partition(b"\r\n\r\n")
    assert head.startswith(answer[:12])
    assert rest == b""


@pytest.mark.parametrize(
    "request_line",
    [
        b"POST /update_weights_from_disk HTTP/1.1",  # SGLang: load other weights
        b"POST /sleep?level=1 HTTP/1.1",  # vLLM dev endpoints
        b"POST /slots/0?action=save HTTP/1.1",  # llama.cpp: writes a file on the host
        b"POST /props HTTP/1.1",  # llama.cpp: changes the server's settings
        b"POST /v1/chat/completions/../../load_lora_adapter HTTP/1.1",
        b"GET /v1/chat/completions HTTP/1.1",  # an inference path, but not as a gateway sends
        b"GET /server_info HTTP/1.1",
        # the statement covers the body, not a query a gateway never sends
        b"POST /v1/chat/completions?model=other HTTP/1.1",
        b"POST /v1/embeddings? HTTP/1.1",
        # nor a probe's query, which would reach the server's access log
        b"GET /metrics?x=1 HTTP/1.1",
        b"GET /health? HTTP/1.1",
    ],
)
def test_only_the_gateways_requests_are_relayed(tmp_path: Path, request_line: bytes) -> None:
    """The server behind the sidecar listens on loopback: the sidecar is the only way in,
    and it relays what a gateway sends, nothing else. An admin endpoint reached through
    it would change the model it serves, and then the sidecar would countersign answers
    of a server someone else reconfigured."""
    request = request_line + (
        b"\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(_CHAT), _CHAT)
    )
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    written = asyncio.run(_relay_once(tmp_path, answer, request, close=False))
    status, _, body = parse(written)
    assert status == 404
    assert json.loads(body)["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "request_line",
    [
        b"POST /v1/chat/completions HTTP/1.1",
        b"POST /v1/completions HTTP/1.1",
        b"POST /v1/embeddings HTTP/1.1",
        *(b"GET %s HTTP/1.1" % p for p in (b"/health", b"/metrics", b"/v1/models")),
        *(b"GET %s HTTP/1.1" % p for p in (b"/props", b"/slots")),
    ],
)
def test_the_gateways_requests_are_relayed(tmp_path: Path, request_line: bytes) -> None:
    request = request_line + (
        b"\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(_CHAT), _CHAT)
    )
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    written = asyncio.run(_relay_once(tmp_path, answer, request))
    status, headers, body = parse(written)
    assert (status, body) == (200, b"{}")
    assert ("x-owngate-attest" in headers) == request_line.startswith(b"POST")


def _body_of(written: bytes) -> tuple[dict[str, str], bytes]:
    """The headers and the de-chunked body of one answer the sidecar wrote."""
    got: dict[str, object] = {"headers": {}, "body": b""}

    class _Parsed:
        def on_header(self, name: bytes, value: bytes) -> None:
            got["headers"][name.decode().lower()] = value.decode()  # type: ignore[index]

        def on_body(self, body: bytes) -> None:
            got["body"] += body  # type: ignore[operator]

    httptools.HttpResponseParser(_Parsed()).feed_data(written)
    return got["headers"], got["body"]  # type: ignore[return-value]


@pytest.mark.parametrize("media_type", [b"Text/Event-Stream", b"TEXT/EVENT-STREAM; charset=utf-8"])
def test_a_stream_is_one_whatever_the_case_of_its_media_type(
    tmp_path: Path, media_type: bytes
) -> None:
    """A media type is case-insensitive, and the gateway relays `Text/Event-Stream` as a
    stream, where it takes the countersignature from the final comment: the sidecar
    must stream it too, or the gateway finds no countersignature (`missing`), and a
    backend's own last comment line would be the one it reads."""
    salts = Salts.generate()
    request = _POST.replace(
        b"host: x\r\n",
        b"host: x\r\nx-request-id: req-case\r\nx-owngate-salts: %s\r\n" % (salts_value(salts)),
    )
    events = b"data: {}\n\ndata: [DONE]\n\n"
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        media_type,
        len(events),
        events,
    )
    written = asyncio.run(_relay_once(tmp_path, answer, request))
    headers, body = _body_of(written)
    assert "x-owngate-attest" not in headers
    tail = SseTail()
    relayed = tail.feed(body) + tail.flush()
    assert relayed == events
    assert tail.countersignature is not None
    key = load_signer(tmp_path / "sidecar.key").verifier()
    check_countersignature(
        base64.b64decode(tail.countersignature),
        key,
        request_id="req-case",
        request_commitment=commit("request", salts.request, _CHAT),
        response_commitment=commit("response", salts.response, events),
    )


@pytest.mark.parametrize(
    "framing",
    [b"content-length: 0\r\n\r\n", b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n"],
    ids=["length", "chunked"],
)
def test_a_stream_without_a_body_is_not_countersigned(tmp_path: Path, framing: bytes) -> None:
    """Without the sidecar, a stream that ends before its first byte is the gateway's to
    try elsewhere (`the stream ended before its first byte`). The sidecar's comment alone
    would be that first byte: the client would get an empty 200 stream instead, a
    countersigned nothing. The sidecar ends it as empty as it came, and whole: one
    chunked end, nothing after it (which the gateway reads as a connection out of step)."""
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + framing
    written = asyncio.run(_relay_once(tmp_path, answer))
    assert written.endswith(b"\r\n\r\n0\r\n\r\n")
    assert written.count(b"0\r\n\r\n") == 1
    headers, body = _body_of(written)
    assert headers["transfer-encoding"] == "chunked"
    assert body == b""


@pytest.mark.parametrize(
    ("status_line", "framing", "signed"),
    [
        (b"HTTP/1.1 200 OK", b"content-length: 2\r\n", True),
        (b"HTTP/1.1 200 OK", b"", False),  # ended by closing: never countersigned
        (b"HTTP/1.1 500 Internal Server Error", b"content-length: 2\r\n", False),
    ],
    ids=["answer", "ended-by-close", "error"],
)
def test_a_backends_own_attest_header_never_reaches_the_gateway(
    tmp_path: Path, status_line: bytes, framing: bytes, signed: bool
) -> None:
    """The server behind the sidecar cannot hand the gateway a countersignature of its
    own (a replayed one, a second one beside the sidecar's): the sidecar writes its own
    head, with at most its own `x-owngate-attest`."""
    forged = base64.b64encode(b'{"payloadType":"forged"}')
    answer = (
        status_line
        + b"\r\ncontent-type: application/json\r\nx-owngate-attest: "
        + forged
        + b"\r\n"
        + framing
        + b"\r\n{}"
    )
    written = asyncio.run(_relay_once(tmp_path, answer))
    assert forged not in written
    assert written.lower().count(b"x-owngate-attest:") == int(signed)


def test_a_request_without_salts_or_id_takes_both_from_one_system_call(tmp_path: Path) -> None:
    """A client that bypassed the gateway sends neither: its salts and its request id
    come from one `getrandom` (the first 64 bytes the salts, the last 8 the id)."""
    taken: list[bytes] = []

    def random(size: int) -> bytes:
        taken.append(os.urandom(size))
        return taken[-1]

    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    written = asyncio.run(_relay_once(tmp_path, answer, random=random))
    status, headers, _ = parse(written)
    assert status == 200
    assert [len(piece) for piece in taken] == [72]
    envelope = json.loads(base64.b64decode(headers["x-owngate-attest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["request_id"] == "attest-" + taken[0][64:].hex()
    assert statement["request_commitment"] == commit("request", taken[0][:32], _CHAT)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
        b"\r\n\r\n10\r\ndata: [DONE]\n\n\r\n\r\n0\r\n\r\n",
    ],
    ids=["whole", "stream"],
)
def test_an_answer_to_a_connection_reset_before_it_is_told_is_not_countersigned(
    tmp_path: Path, answer: bytes
) -> None:
    """uvloop closes a connection its client (the gateway) reset at once and tells the
    protocol a turn later: an answer finished in between was countersigned and logged,
    then dropped unwritten (`protocol.Connection`), a statement for an answer no one got."""
    transport = FakeTransport()
    served: list[asyncio.Event] = []

    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(asyncio.Event())
        await reader.readuntil(b"\r\n\r\n")
        transport.close()  # the gateway's reset: closing, `connection_lost` not yet delivered
        writer.write(answer)
        await writer.drain()
        await reader.read()  # until the sidecar closes (or aborts)
        writer.close()
        served[-1].set()

    async def main() -> bytes:
        server = await asyncio.start_server(backend, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        key = tmp_path / "sidecar.key"
        write_signing_key(key, "sidecar")
        settings = AttestSettings(
            backend=f"http://127.0.0.1:{port}", key_file=key, log_dir=tmp_path / "log"
        )
        relay = AttestRelay(settings)
        assert await relay.open() is None
        try:
            connection = Listener(relay, LIMITS, 4096, keepalive_s=30.0).protocol()
            connection.connection_made(transport)  # type: ignore[arg-type]
            connection.data_received(_POST)
            assert connection.task is not None
            await asyncio.wait_for(asyncio.shield(connection.task), WAIT_S)
            connection.connection_lost(ConnectionResetError())
            return bytes(transport.written)
        finally:
            await relay.close()
            server.close()
            for event in served:  # the backend's side of each connection closed too
                await asyncio.wait_for(event.wait(), WAIT_S)

    assert asyncio.run(main()) == b""
    assert records(tmp_path / "log") == []  # nothing countersigned, nothing logged


@pytest.mark.parametrize(
    "media_type",
    [
        b"text/event-streamX",
        b"text/event-stream-extra",
        b"text/event-stream; charset=latin-1",
        b"application/jsonp",
        b"application/json; charset=utf-16",
        b"text/html",
    ],
)
@pytest.mark.parametrize("framing", [b"content-length: %d\r\n", b""], ids=["length", "closed"])
def test_an_answer_of_a_type_the_gateway_does_not_relay_is_never_countersigned(
    tmp_path: Path, media_type: bytes, framing: bytes
) -> None:
    """The gateway relays an event stream or JSON, in UTF-8, and nothing else
    (gateway/upstream/content_types.py): the sidecar took any type that began with
    `text/event-stream` for a stream and countersigned it, a statement for an answer no
    client of the gateway gets (and a stream whose charset the client would decode
    otherwise). It is refused instead, with nothing signed or logged."""
    events = b"data: {}\n\ndata: [DONE]\n\n"
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\n%s\r\n%s" % (
        media_type,
        framing.replace(b"%d", b"%d" % len(events)),
        events,
    )
    written = asyncio.run(_relay_once(tmp_path, answer))
    status, headers, body = parse(written)
    assert status == 502, written
    assert json.loads(body)["error"]["code"] == "upstream_error"
    assert b"owngate-attest" not in written
    assert b"[DONE]" not in written
    assert "x-owngate-attest" not in headers


@pytest.mark.parametrize("media_type", [b"application/json", b"application/json; charset=UTF-8"])
def test_a_json_answer_is_countersigned_whatever_its_utf8_charset_says(
    tmp_path: Path, media_type: bytes
) -> None:
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: 2\r\n\r\n{}" % media_type
    written = asyncio.run(_relay_once(tmp_path, answer))
    status, headers, body = parse(written)
    assert (status, body) == (200, b"{}")
    assert "x-owngate-attest" in headers


_SSE_BODY = (
    b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    b"9\r\ndata: x\n\n\r\n0\r\n\r\n"
)
_JSON_BODY = b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


@pytest.mark.parametrize(
    ("status_line", "rest"),
    [
        (b"HTTP/1.1 204 No Content", b"content-type: application/json\r\n\r\n"),
        (b"HTTP/1.1 205 Reset Content", _JSON_BODY),
        (b"HTTP/1.1 205 Reset Content", _SSE_BODY),
        (b"HTTP/1.1 304 Not Modified", b"content-type: application/json\r\n\r\n"),
        (b"HTTP/1.1 302 Found", b"location: http://elsewhere/\r\n" + _JSON_BODY),
        (b"HTTP/1.1 307 Temporary Redirect", _SSE_BODY),
        (b"HTTP/1.1 300 Multiple Choices", _JSON_BODY),
    ],
    ids=["204", "205-json", "205-stream", "304", "302", "307-stream", "300"],
)
def test_an_answer_of_a_status_the_gateway_does_not_relay_is_never_countersigned(
    tmp_path: Path, status_line: bytes, rest: bytes
) -> None:
    """The gateway refuses a 204, 205 or 304 and any other 3xx before its client sees a
    byte (gateway/api/answer_reads.py `check_status`), as it does an error: the sidecar
    relays one unsigned (content_types.py `relayed_status`, the rule both share). Before,
    it countersigned and logged them all, the backend host's word that it served an
    answer no client got, as for a content type the gateway does not relay (above)."""
    written = asyncio.run(_relay_once(tmp_path, status_line + b"\r\n" + rest))
    assert written.startswith(status_line[:12]), written[:40]
    assert b"owngate-attest" not in written.lower()
    assert records(tmp_path / "log") == []  # nor a statement in the sidecar's log


def test_a_2xx_answer_with_a_body_is_countersigned_whichever_2xx(tmp_path: Path) -> None:
    written = asyncio.run(_relay_once(tmp_path, b"HTTP/1.1 201 Created\r\n" + _JSON_BODY))
    assert b"x-owngate-attest:" in written.lower()
    assert [record["type"] for record in records(tmp_path / "log")] == ["attestation"]
