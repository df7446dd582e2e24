"""The public listener's limits (`gateway.listener`), over raw sockets.

A real gateway (`ServerThread`, and `owngate serve` in a subprocess where its memory is
measured) meets what a hostile client sends: endless or too many headers (431), silent
sockets and slowloris heads (closed, 408), stalled bodies (408) and malformed HTTP
(400). Every answer is an OpenAI error object and the connection is closed. Timeouts are
short here (0.5 s); each test waits on the socket's end with a generous bound, never on
a sleep being long enough. The cases that need reads split at a chosen byte run the
protocol against a recording transport instead of a socket. More connections than the
cap: tests/integration/test_listener_room.py.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from uvicorn.server import ServerState

from gateway.app import create_app
from gateway.config.schema import ListenSettings
from gateway.errors import ErrorCode
from gateway.listener import http_protocol
from gateway.listener_limits import ListenerLimits, derived_max_connections
from gateway.serving import ServerThread, uvicorn_config
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.protocol_wire import Wire, connect_protocol, finish
from tests.helpers.raw_socket import (
    WAIT_S,
    assert_refused,
    connect,
    exchange,
    parse,
    read_answer,
    read_to_end,
)

SHORT = {"header_timeout_s": 0.5, "body_timeout_s": 0.5}
CHAT = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'


@pytest.fixture
def start_listener(start_sim: Callable[..., Sim]) -> Iterator[Callable[..., ServerThread]]:
    """A gateway in front of one simulator, with `listen` settings from the arguments."""
    started: list[ServerThread] = []
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)

    def start(**listen: Any) -> ServerThread:
        config = gateway_config([backend("gpu", sim.url, "sim-model")], listen=listen)
        server = ServerThread(create_app(config, environ={}), listen=config.listen).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# header size and count


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nx-big: " + b"a" * 40_000 + b"\r\n",
        b"GET /healthz?q=" + b"a" * 40_000 + b" HTTP/1.1\r\n",
        b"GET /healthz HTTP/1.1\r\n"
        + b"".join(b"x-h%d: %s\r\n" % (i, b"a" * 900) for i in range(40)),
    ],
    ids=["one-value", "url", "many-fields"],
)
def test_oversize_head_is_431_and_closed(
    start_listener: Callable[..., ServerThread], head: bytes
) -> None:
    server = start_listener()
    raw = exchange(server, head + b"\r\n")
    error = assert_refused(raw, 431, "headers_too_large")
    assert "32768" in error["message"]


def test_too_many_headers_is_431(start_listener: Callable[..., ServerThread]) -> None:
    server = start_listener(max_headers=20)
    fields = b"".join(b"x-h%d: v\r\n" % i for i in range(21))
    raw = exchange(server, b"GET /healthz HTTP/1.1\r\n" + fields + b"\r\n")
    assert_refused(raw, 431, "headers_too_large")
    # at the limit it is served
    fields = b"".join(b"x-h%d: v\r\n" % i for i in range(19))
    raw = exchange(server, b"GET /healthz HTTP/1.1\r\nconnection: close\r\n" + fields + b"\r\n")
    assert parse(raw)[0] == 200


def _stream_header(port: int, total: int) -> tuple[int, bytes]:
    """Send one header value that never ends, up to `total` bytes, while watching for
    the server's answer; returns (bytes sent, what the server sent before closing)."""
    chunk = b"a" * 65536
    sent = 0
    deadline = time.monotonic() + 3 * WAIT_S
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 18)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nx-endless: ")
        while sent < total and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                return sent, read_to_end(sock)
            if writable:
                try:
                    sent += sock.send(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    return sent, read_to_end(sock)
        return sent, b""


def test_endless_header_is_cut_early_and_memory_stays_flat(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """`owngate serve` applies `listen.*` from gateway.yaml; a 50 MB header stream is
    answered 431 and closed after at most a few MB, and the server's RSS does not grow
    with it (uvicorn alone buffered it all: 4 such connections took 600 MB)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port, "max_header_bytes": 16384},
        "logging": {"format": "json", "level": "error", "access_log": False},
        "backends": [backend("gpu", sim.url, "m")],
    }
    gateway = GatewayProcess(config, tmp_path).start()
    try:
        assert gateway.proc is not None
        # the configured limit, not the default 32 KB, is the one applied
        raw = exchange_port(port, b"GET /healthz HTTP/1.1\r\nx-big: " + b"a" * 20_000 + b"\r\n\r\n")
        assert_refused(raw, 431, "headers_too_large")
        before = gateway.rss_bytes()
        for _ in range(4):
            sent, raw = _stream_header(port, 50 * 1024 * 1024)
            # what the server read (its limit, then 1 MiB dropped while lingering) plus what
            # the kernel buffers on both sides hold (a few MB on loopback)
            assert sent < 16 * 1024 * 1024, f"the server read {sent} bytes of one header"
            assert_refused(raw, 431, "headers_too_large")
        grown = gateway.rss_bytes() - before
        assert grown < 32 * 1024 * 1024, f"RSS grew by {grown} bytes"
    finally:
        gateway.stop()


def exchange_port(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(data)
        return read_to_end(sock)


# slow and silent connections


def test_silent_connection_is_closed_after_the_header_timeout(
    start_listener: Callable[..., ServerThread],
) -> None:
    server = start_listener(**SHORT)
    with connect(server) as sock:
        assert read_to_end(sock) == b""  # closed quietly: nothing was asked


def test_slowloris_head_gets_408_and_is_closed(
    start_listener: Callable[..., ServerThread],
) -> None:
    server = start_listener(**SHORT)
    head = b"GET /healthz HTTP/1.1\r\n" + b"x-slow: " + b"a" * 10_000
    with connect(server) as sock:
        deadline = time.monotonic() + WAIT_S
        for byte in head:  # a byte every 50 ms until the server answers
            assert time.monotonic() < deadline, "the server kept a slowloris head open"
            if select.select([sock], [], [], 0.05)[0]:
                break
            sock.send(bytes([byte]))
        raw = read_to_end(sock)
    assert_refused(raw, 408, "request_timeout")


def test_stalled_body_gets_408_and_is_closed(start_listener: Callable[..., ServerThread]) -> None:
    server = start_listener(**SHORT)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(CHAT)
    )
    raw = exchange(server, head + CHAT[:10])
    error = assert_refused(raw, 408, "request_timeout")
    assert "body" in error["message"]
    # the app, which was reading that body, counts what the client got
    assert _chat_statuses(server) == {"408": 1.0}


def test_a_body_that_never_starts_gets_408_and_is_counted_so(
    start_listener: Callable[..., ServerThread],
) -> None:
    server = start_listener(**SHORT)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\ncontent-length: 50\r\n\r\n"
    )
    assert_refused(exchange(server, head), 408, "request_timeout")
    assert _chat_statuses(server) == {"408": 1.0}  # not 400 invalid_json for an empty body


def _chat_statuses(server: ServerThread) -> dict[str, float]:
    """`owngate_requests_total` of the chat endpoint by status, once the request that
    ended is counted (the app counts it after the client got its answer)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        text = httpx.get(f"{server.url}/metrics", timeout=WAIT_S).text
        counts = {
            sample.labels["status"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "owngate_requests_total" and sample.labels["endpoint"] == "chat"
        }
        if counts:
            return counts
        select.select([], [], [], 0.01)
    raise AssertionError("the request was never counted")


def test_stalled_body_after_an_early_answer_is_closed(
    start_listener: Callable[..., ServerThread],
) -> None:
    """A body no handler reads (here: refused for its missing key) is bounded too."""
    server = start_listener(**SHORT)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n"
    raw = exchange(server, head + b"{")
    status, headers, body = parse(raw)
    # 401 from the app; 408 only if the deadline passed before the app answered
    assert status in (401, 408)
    assert len(body) == int(headers["content-length"])  # and then the close, no second answer


def test_idle_keepalive_outlives_the_header_timeout(
    start_listener: Callable[..., ServerThread],
) -> None:
    """The header timeout starts at a request's first byte: the idle time between
    requests on a keep-alive connection is `keepalive_timeout_s` (30 s here)."""
    server = start_listener(**SHORT)
    request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        # idle past the header timeout; the connection must still be open
        assert not select.select([sock], [], [], 1.0)[0]
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("blank", [b"\r\n", b"\n", b"\r\n" * 100])
def test_blank_lines_after_an_answer_do_not_keep_a_connection_open(
    start_listener: Callable[..., ServerThread], blank: bytes
) -> None:
    """Empty lines before a request line are skipped (RFC 9112 section 2.2) without
    beginning a head, but they are bytes: uvicorn cancels its keep-alive timer at any
    read. Before, a client that sent `\\r\\n` after an answer held the connection open
    with no deadline at all (neither the keep-alive nor the head timer armed)."""
    server = start_listener(**SHORT, keepalive_timeout_s=0.5)
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_answer(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(blank)
        assert read_to_end(sock) == b""  # closed quietly: no head ever began


# framing errors


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GE\x01T /healthz HTTP/1.1\r\n\r\n",  # request line
        b"GET /healthz HTTP/1.1\r\nbad header\r\n\r\n",  # header line
        b"POST /v1/chat/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"GET /healthz HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS on a plain-text port
    ],
    ids=["request-line", "header", "chunked", "two-lengths", "tls"],
)
def test_malformed_request_gets_a_json_400(
    start_listener: Callable[..., ServerThread], request_bytes: bytes
) -> None:
    server = start_listener()
    assert_refused(exchange(server, request_bytes), 400, "invalid_request")


# the protocol alone, with reads split where a test needs them


async def _echo_length(scope: dict[str, Any], receive: Any, send: Any) -> None:
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = str(size).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _feed(reads: list[bytes], **listen: Any) -> bytes:
    """Feed `reads` to one protocol instance, one `data_received` each, and return
    what it wrote once the app is done."""

    async def run() -> bytes:
        protocol, wire, tasks = connect_protocol(_echo_length, **listen)
        for data in reads:
            protocol.data_received(data)
        await finish(tasks)
        return bytes(wire.out)

    return asyncio.run(run())


def test_a_head_split_over_reads_is_counted_whole() -> None:
    head = b"GET / HTTP/1.1\r\nx-a: " + b"a" * 20_000 + b"\r\nx-b: " + b"b" * 20_000
    pieces = [head[i : i + 1000] for i in range(0, len(head), 1000)] + [b"\r\n\r\n"]
    assert parse(_feed(pieces))[0] == 431
    small = b"GET / HTTP/1.1\r\nx-a: " + b"a" * 20_000 + b"\r\n\r\n"
    assert parse(_feed([small[i : i + 1000] for i in range(0, len(small), 1000)]))[0] == 200


def test_a_pipelined_head_begun_in_the_read_that_ended_a_body_is_counted() -> None:
    """A head that begins in a read which began in the previous request's body counts
    from that read: only reads that began in a head were added, so the part that came
    with the body's end (up to a read, 256 KiB) was never counted, and a 40 KB head
    whose last bytes came apart was served past a 32 KiB limit."""
    first = b"POST / HTTP/1.1\r\ncontent-length: 4\r\n\r\nab"
    second = b"GET / HTTP/1.1\r\nx-a: " + b"a" * 40_000
    out = _feed([first, b"cd" + second, b"\r\n\r\n"])
    assert out.count(b"HTTP/1.1 200") == 1 and out.count(b"HTTP/1.1 431") == 1
    # the same after a whole request in that read (the count was reset when it ended)
    out = _feed([b"GET / HTTP/1.1\r\n\r\n" + second, b"\r\n\r\n"])
    assert out.count(b"HTTP/1.1 200") == 1 and out.count(b"HTTP/1.1 431") == 1
    # a small pipelined head that way is served
    out = _feed([first, b"cd" + second[:-39_000], b"\r\n\r\n"])
    assert out.count(b"HTTP/1.1 200") == 2


def test_a_pipelined_head_after_a_body_of_small_chunks_is_counted_alone() -> None:
    """A head begun in the read that ended the request before it counts its own lines,
    not the chunk framing before it: after a body of small chunks (more framing than the
    limit), a small pipelined head split over reads was 431."""
    chunked = b"POST / HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n\r\n"
    chunked += b"1\r\na\r\n" * 10_000 + b"0\r\n\r\n"
    second = b"GET / HTTP/1.1\r\nhost: g\r\nx-a: " + b"a" * 20_000
    out = _feed([chunked + second, b"\r\n\r\n"])
    assert out.count(b"HTTP/1.1 200") == 2, out[-300:]
    # a head past the limit in many lines is still counted whole
    fields = b"".join(b"x-%d: %s\r\n" % (i, b"v" * 1000) for i in range(30))
    out = _feed([chunked + b"GET / HTTP/1.1\r\n" + fields + b"x-b: ", b"b" * 5000 + b"\r\n\r\n"])
    assert out.count(b"HTTP/1.1 200") == 1 and out.count(b"HTTP/1.1 431") == 1


def test_a_small_head_in_one_read_with_a_large_body_is_served() -> None:
    """The read is over the limit but the head is not: only the head counts."""
    body = b"x" * 200_000
    request = b"POST / HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    status, _, answer = parse(_feed([request]))
    assert (status, answer) == (200, b"200000")
    # and a pipelined second request whose head ends inside the same read
    second = b"GET / HTTP/1.1\r\n\r\n"
    out = _feed([request + second])
    assert out.count(b"HTTP/1.1 200") == 2


def test_a_large_head_in_one_read_with_its_body_is_431() -> None:
    request = b"POST / HTTP/1.1\r\nx-a: " + b"a" * 40_000 + b"\r\ncontent-length: 3\r\n\r\nabc"
    assert parse(_feed([request]))[0] == 431


@pytest.mark.parametrize(
    ("head_extra", "first_part"),
    [(b"expect: 100-continue\r\n", b""), (b"", b"x" * 100_000)],
    ids=["100-continue-not-sent", "reading-paused"],
)
def test_the_body_deadline_starts_over_while_the_gateway_holds_the_body(
    head_extra: bytes, first_part: bytes
) -> None:
    """An app that reads late is not the client's fault: no 408 while the gateway has
    not asked for the body (100-continue) or has paused reading (flow control)."""
    size = len(first_part) + 100_000
    head = b"POST / HTTP/1.1\r\n" + head_extra + b"content-length: %d\r\n\r\n" % size

    async def run() -> bytes:
        reading = asyncio.Event()

        async def late_reader(scope: dict[str, Any], receive: Any, send: Any) -> None:
            # Past several body deadlines: they fire first (timers run in deadline order).
            await asyncio.sleep(0.2)
            reading.set()
            await _echo_length(scope, receive, send)

        protocol, wire, tasks = connect_protocol(late_reader, body_timeout_s=0.04)
        protocol.data_received(head + first_part)
        await reading.wait()
        protocol.data_received(b"y" * 100_000)
        await finish(tasks)
        return bytes(wire.out)

    out = asyncio.run(run())
    assert b"408" not in out
    assert out.endswith(b"\r\n\r\n%d" % size)


# settings


def test_listen_defaults_and_the_derived_connection_cap() -> None:
    limits = ListenerLimits.from_config(ListenSettings(max_connections=100))
    assert (limits.max_header_bytes, limits.max_headers) == (32 * 1024, 100)
    assert (limits.header_timeout_s, limits.body_timeout_s) == (10.0, 60.0)
    assert limits.max_connections == 100
    assert derived_max_connections(1024) == 480
    assert derived_max_connections(-1) == derived_max_connections(10**9) == 4096
    assert derived_max_connections(10) == 1
    assert ListenerLimits.from_config(ListenSettings()).max_connections > 0
    assert http_protocol(ListenSettings()).limits == ListenerLimits.from_config(ListenSettings())
    assert ErrorCode.headers_too_large.status == 431
    assert ErrorCode.request_timeout.status == 408


def test_a_request_with_trailer_fields_is_refused() -> None:
    """A trailer field after a chunked body is refused, never read as a header (uvicorn
    appended them to the same list after the app had read it: a data-class label could
    'arrive' after the policy looked) and never silently dropped (a label sent there
    would be read as 'no label')."""
    seen: list[list[bytes]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            more = message.get("more_body", False)
        seen.append([name for name, _ in scope["headers"]])
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})

    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n"
        b"connection: close\r\n\r\n"
    )
    with ServerThread(app) as server:
        status, _, body = parse(exchange(server, head + b"2\r\n{}\r\n0\r\n\r\n"))
        assert (status, body) == (200, b"ok")  # no trailers: served
        trailer = head + b"2\r\n{}\r\n0\r\nx-data-class: phi\r\n\r\n"
        status, _, body = parse(exchange(server, trailer))
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_request"
    assert len(seen) == 1 and b"x-data-class" not in seen[0]


def test_an_endless_trailer_is_431_before_it_grows() -> None:
    """The parser buffers a trailer field until it ends: bytes between body data are held
    to the head limit, so one that never ends is cut, not buffered."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while scope["type"] == "http":
            if (await receive())["type"] == "http.disconnect":
                return

    limit = 4096
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n"
        b"\r\n2\r\n{}\r\n0\r\nx-a: "
    )
    with ServerThread(app, listen=ListenSettings(max_header_bytes=limit)) as server:
        sock = connect(server)
        sent = 0
        with sock:
            sock.sendall(head)
            try:
                for _ in range(2000):  # bounded: at most 2,000 x 4 KiB = 8 MB
                    sock.sendall(b"a" * 4096)
                    sent += 4096
            except OSError:
                pass  # refused and closed while still sending
            answer = read_to_end(sock)
    assert sent < 2000 * 4096  # cut long before the client was done
    status, _, body = parse(answer)
    assert status == 431 and json.loads(body)["error"]["code"] == "headers_too_large"


@pytest.mark.parametrize(
    "framing",
    [b"2;e=" + b"a" * 40_000, b"2\r\n{}\r\n0\r\nx-a: " + b"a" * 40_000],
    ids=["chunk-extension", "trailer"],
)
def test_framing_in_the_read_that_brought_the_head_is_counted(framing: bytes) -> None:
    """Bytes between body data are held to the head limit in the read that ended the head
    too. Only reads that began in the body were counted: a chunk line (or a trailer
    field, which the parser buffers until it ends) that came in one read with the head
    started at zero in the next one, so a read of up to 256 KiB (uvloop's) went past the
    limit unseen."""
    head = b"POST / HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n\r\n"
    rest = b"\r\n{}\r\n0\r\n\r\n" if framing.startswith(b"2;") else b"\r\n\r\n"
    status, _, body = parse(_feed([head + framing, rest]))
    assert status == 431 and json.loads(body)["error"]["code"] == "headers_too_large"
    # within the limit: served (the extension) or refused as a trailer (400), as before
    small = framing[:-39_000]
    assert parse(_feed([head + small, rest]))[0] == (200 if framing.startswith(b"2;") else 400)


def test_many_small_chunks_are_served() -> None:
    """Chunk framing is bounded between body bytes, not in total: a body of many tiny
    chunks (more framing than the head limit in all) is fine."""
    got: list[bytes] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        parts, more = [], True
        while more:
            message = await receive()
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        got.append(b"".join(parts))
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})

    chunks = b"".join(b"1;ext=x\r\n%c\r\n" % (97 + i % 26) for i in range(3000))
    request = (
        b"POST /x HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\nconnection: close\r\n"
        b"\r\n" + chunks + b"0\r\n\r\n"
    )
    with ServerThread(app, listen=ListenSettings(max_header_bytes=1024)) as server:
        status, _, body = parse(exchange(server, request))
    assert (status, body) == (200, b"ok")
    assert len(got[0]) == 3000


@pytest.mark.parametrize("size", [1, 20])
@pytest.mark.parametrize("begins", ["with-the-head", "in-the-body"])
def test_a_read_of_many_small_chunks_is_served(size: int, begins: str) -> None:
    """Only the framing a read ends with carries into the next read, not all the framing
    between its body bytes: one read of small chunks (a client's generator yielding a
    few bytes each) with more framing than the head limit in all, and the body still
    arriving, was 431, in a read that began in the body, and since the framing of the
    read that ended the head was counted, in that one too."""
    head = b"POST / HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n\r\n"
    chunks = b"".join(b"%x\r\n%s\r\n" % (size, b"a" * size) for _ in range(200_000 // (size + 6)))
    reads = [head + chunks, b"0\r\n\r\n"]
    if begins == "in-the-body":
        reads = [head + b"1\r\na\r\n", chunks, b"0\r\n\r\n"]
    status, _, body = parse(_feed(reads))
    assert status == 200, body
    # what the read ends with still counts: an endless chunk line or trailer field
    for tail in [b"3;e=" + b"a" * 40_000, b"0\r\nx-a: " + b"a" * 40_000]:
        status, _, body = parse(_feed([*reads[:-2], reads[-2] + tail, b"\r\n"]))
        assert status == 431 and json.loads(body)["error"]["code"] == "headers_too_large"


def test_an_upgrade_request_is_refused_and_its_body_never_runs() -> None:
    """The parser stops at a head that asks for an upgrade; served as plain HTTP, the
    body was read later as a request of its own (smuggled past a proxy in front, with its
    own key and labels). One request on the wire gets one answer: a 400."""
    paths: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        paths.append(scope["path"])
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})

    inner = b"GET /smuggled HTTP/1.1\r\nhost: g\r\n\r\n"
    outer = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\nupgrade: h2c\r\n"
        b"connection: upgrade\r\ncontent-length: %d\r\n\r\n" % len(inner)
    )
    with ServerThread(app) as server, connect(server) as sock:
        sock.sendall(outer)
        sock.sendall(inner)  # a later read: the old protocol parsed it from scratch
        answer = read_to_end(sock)
    status, _, body = parse(answer)
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_request"
    assert answer.count(b"HTTP/1.1 ") == 1  # one answer, never a second for the body
    assert paths == []


def test_too_many_headers_are_refused_before_the_head_ends() -> None:
    """Each header field is held as Python objects (~25 times its bytes for short fields):
    the count is refused as it passes the limit, not once a head of 8,000 tiny fields
    has been held (it may never end)."""
    head = b"GET / HTTP/1.1\r\n" + b"x: y\r\n" * 150  # not ended: no blank line
    assert parse(_feed([head], max_headers=100))[0] == 431


def test_a_client_that_reads_nothing_of_a_stream_is_cut_off_at_the_write_timeout() -> None:
    """uvicorn waits without limit for a client that reads nothing (writing paused): a
    stream's relay, and the backend connection it holds, would wait forever. Past
    `write_timeout_s` the connection is dropped and the app sees the client gone."""

    async def run() -> list[str]:
        seen: list[str] = []
        done = asyncio.Event()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            seen.append((await receive())["type"])
            done.set()

        protocol, wire, _ = connect_protocol(app, write_timeout_s=0.05)
        protocol.pause_writing()  # the client's buffers are full: it reads nothing
        protocol.data_received(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        try:
            await asyncio.wait_for(done.wait(), WAIT_S)
            assert wire.closed  # by the protocol, not by the client
        finally:
            wire.close()  # (without the timeout the app waits until the client leaves)
        return seen

    assert asyncio.run(run()) == ["http.disconnect"]


class _HeldWire(Wire):
    """A transport that keeps `held` bytes of what was written (its client reads nothing
    more), fewer than the mark at which writing pauses: `close` waits for them, as
    uvloop's does, and only `abort` ends the connection then."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.held = 0
        self.closing = False
        self.aborted = False
        self.ended = asyncio.Event()

    def get_write_buffer_size(self) -> int:
        return self.held

    def close(self) -> None:
        self.closing = True
        if not self.held:
            super().close()
            self.ended.set()

    def is_closing(self) -> bool:
        return self.closing or self.closed

    def abort(self) -> None:
        self.aborted = True
        super().close()
        self.ended.set()


class _ReadingWire(_HeldWire):
    """A `_HeldWire` whose client takes 4,000 of the held bytes between two looks at
    them: slowly, but it reads."""

    def get_write_buffer_size(self) -> int:
        held = self.held
        self.held = max(0, held - 4_000)
        if not self.held and self.closing and not self.closed:
            self.loop.call_soon(self.close)  # flushed: the close completes
        return held


def _held_answer(
    request: bytes, held: int, *, paused: bool = False, wire_type: type[_HeldWire] = _HeldWire
) -> tuple[bool, bool]:
    """Answer `request` on a `_HeldWire` whose client leaves `held` bytes of the answer
    unread (with `paused`: after the answer ended, writing paused, and resumed once the
    client read all but `held`); (aborted, closed) once the connection ended, the
    keep-alive timeout and `write_timeout_s` short."""

    async def run() -> tuple[bool, bool]:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            headers = [(b"content-length", b"40000")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"x" * 40_000})

        loop = asyncio.get_running_loop()
        wire = wire_type(loop)
        config = uvicorn_config(app, ListenSettings(keepalive_timeout_s=0.05, write_timeout_s=0.05))
        config.load()
        state = ServerState()
        protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=state, app_state={}, _loop=loop
        )
        wire.protocol = protocol
        protocol.connection_made(wire)
        if not paused:
            wire.held = held  # the answer's tail: below the pause mark, never paused
        protocol.data_received(request)
        await finish(state.tasks)
        if paused:
            protocol.pause_writing()
            wire.held = held
            protocol.resume_writing()
        await asyncio.wait_for(wire.ended.wait(), WAIT_S)  # (before: never ended)
        return wire.aborted, wire.closed

    return asyncio.run(run())


@pytest.mark.parametrize("close", [b"connection: close\r\n", b""], ids=["close", "keep-alive"])
def test_an_answers_unread_tail_is_cut_off_at_the_write_timeout(close: bytes) -> None:
    """The write deadline ran only while writing was paused (more than the transport's
    high-water mark unsent). An answer whose last bytes stayed unread below that mark
    (any answer some 20 KB longer than what the kernel's buffers take) never paused it:
    the close after `connection: close` or the keep-alive timeout waits for those bytes
    without end, and the connection, neither waiting nor stalled, was never dropped at
    the cap either. Measured over loopback: 5 clients with `SO_RCVBUF` 1024 each held a
    connection for good (write_timeout_s 1 s, keep-alive 0.5 s)."""
    request = b"GET / HTTP/1.1\r\nhost: x\r\n" + close + b"\r\n"
    assert _held_answer(request, held=20_000) == (True, True)


def test_an_answers_tail_left_unread_after_writing_resumed_is_cut_off() -> None:
    """An answer that ended while writing was paused: the client reads until writing
    resumes (below the low-water mark, the pause's deadline cancelled) and stops."""
    request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
    assert _held_answer(request, held=5_000, paused=True) == (True, True)


def test_an_answers_tail_read_slowly_is_not_cut() -> None:
    """The deadline is on reading nothing: each look that finds fewer bytes left starts
    it over, and the close completes once the client has them all."""
    request = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    assert _held_answer(request, held=20_000, wire_type=_ReadingWire) == (False, True)


def test_an_answer_the_client_took_whole_is_closed_not_cut() -> None:
    request = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    assert _held_answer(request, held=0) == (False, True)


class _LookedWire(_HeldWire):
    """A `_HeldWire` that counts the protocol's looks at what it holds."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.looks = 0
        self.looked = asyncio.Event()

    def get_write_buffer_size(self) -> int:
        self.looks += 1
        self.looked.set()
        return self.held


def test_an_earlier_tail_does_not_cut_a_later_answer_going_out() -> None:
    """The tail deadline of an answer is about reading nothing while no answer goes out:
    while a later one does (a stream), its own pause has the deadline. Each look the
    protocol takes at the held bytes while the stream goes out is a deadline passing."""

    async def run() -> list[bool]:
        loop = asyncio.get_running_loop()
        wire = _LookedWire(loop)
        cut_meanwhile: list[bool] = []

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["path"] == "/whole":
                headers = [(b"content-length", b"4")]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": b"xxxx"})
                return
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            start = wire.looks
            while wire.looks < start + 3 and not wire.aborted:  # three deadlines passed
                wire.looked.clear()
                await asyncio.wait_for(wire.looked.wait(), WAIT_S)
            cut_meanwhile.append(wire.aborted)
            await send({"type": "http.response.body", "body": b""})

        config = uvicorn_config(app, ListenSettings(write_timeout_s=0.05))
        config.load()
        state = ServerState()
        protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=state, app_state={}, _loop=loop
        )
        wire.protocol = protocol
        protocol.connection_made(wire)
        wire.held = 20_000  # the first answer's tail, never taken
        protocol.data_received(
            b"GET /whole HTTP/1.1\r\nhost: x\r\n\r\nGET /stream HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        await finish(state.tasks)
        await asyncio.wait_for(wire.ended.wait(), WAIT_S)  # then cut: nothing was read
        return [*cut_meanwhile, wire.aborted]

    assert asyncio.run(run()) == [False, True]
