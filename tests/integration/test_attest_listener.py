"""The sidecar's own listener (`gateway.attest.protocol`) over raw sockets: the gateway
listener's limits hold there too (slowloris and silent sockets, oversize heads, bodies
over `--max-body-bytes`, stalled bodies, malformed framing, trailers, upgrades, the
connection cap), every refusal is an OpenAI error object and nothing refused is
countersigned. Timeouts are short (0.5 s); each test waits on the socket's end with a
bound, never on a sleep."""

from __future__ import annotations

import base64
import select
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.attest import AttestSettings, AttestThread, listener_context
from gateway.config.schema import ListenSettings
from gateway.pki import issue, make_ca
from gateway.provenance import write_signing_key
from gateway.provenance.formats.attestation import open_countersignature
from tests.helpers.gateways import Sim
from tests.helpers.processes import owngate_argv
from tests.helpers.provenance import records
from tests.helpers.raw_socket import (
    WAIT_S,
    assert_refused,
    connect,
    exchange,
    parse,
    read_answer,
    read_to_end,
)
from tests.helpers.waiting import until

SHORT = {"header_timeout_s": 0.5, "body_timeout_s": 0.5}
CHAT = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'
MAX_BODY = 4096


def _post(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n%s" % (len(body), extra, body)
    )


@pytest.fixture
def start_sidecar(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[Callable[..., AttestThread]]:
    """An in-process sidecar in front of a zero-latency simulator, with `listen` limits
    from the arguments and a request body limit of MAX_BODY."""
    started: list[AttestThread] = []
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)

    def start(tls: ssl.SSLContext | None = None, **listen: Any) -> AttestThread:
        key = tmp_path / f"sidecar{len(started)}.key"
        write_signing_key(key, "sidecar")
        settings = AttestSettings(
            backend=sim.url,
            key_file=key,
            log_dir=tmp_path / f"log{len(started)}",
            max_body=MAX_BODY,
        )
        sidecar = AttestThread(settings, ssl_context=tls, listen=ListenSettings(**listen))
        sidecar.start()
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


def _logged(tmp_path: Path, number: int = 0) -> list[dict[str, Any]]:
    return records(tmp_path / f"log{number}")


def test_a_request_is_relayed_and_countersigned_on_a_kept_alive_connection(
    start_sidecar: Callable[..., AttestThread], tmp_path: Path
) -> None:
    """Two requests, pipelined on one connection, both answered in order with their
    countersignature; the statements are logged once the sidecar stops."""
    sidecar = start_sidecar()
    with connect(sidecar) as sock:
        sock.sendall(
            _post(CHAT, b"x-request-id: one\r\n")
            + _post(CHAT, b"x-request-id: two\r\nconnection: close\r\n")
        )
        raw = read_to_end(sock)
    first, _, rest = raw.partition(b"HTTP/1.1 200 OK\r\n")[2].partition(b"HTTP/1.1 ")
    answers = [parse(b"HTTP/1.1 200 OK\r\n" + first), parse(b"HTTP/1.1 " + rest)]
    ids = []
    for status, headers, body in answers:
        assert status == 200 and b"choices" in body
        envelope = base64.b64decode(headers["x-owngate-attest"])
        ids.append(open_countersignature(envelope).statement.request_id)
    assert ids == ["one", "two"]
    assert answers[1][1]["connection"] == "close"
    sidecar.stop()
    assert [r["request_id"] for r in _logged(tmp_path)] == ["one", "two"]


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v1/chat/completions HTTP/1.1\r\nx-big: " + b"a" * 40_000 + b"\r\n",
        b"POST /v1/chat/completions?q=" + b"a" * 40_000 + b" HTTP/1.1\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        + b"".join(b"x-h%d: %s\r\n" % (i, b"a" * 900) for i in range(40)),
    ],
    ids=["one-value", "url", "many-fields"],
)
def test_an_oversize_head_is_431(
    start_sidecar: Callable[..., AttestThread], tmp_path: Path, head: bytes
) -> None:
    sidecar = start_sidecar()
    error = assert_refused(exchange(sidecar, head + b"\r\n"), 431, "headers_too_large")
    assert "32768" in error["message"]
    sidecar.stop()
    assert _logged(tmp_path) == []


def test_too_many_headers_is_431(start_sidecar: Callable[..., AttestThread]) -> None:
    sidecar = start_sidecar(max_headers=10)
    extra = b"".join(b"x-h%d: v\r\n" % i for i in range(11))
    error = assert_refused(exchange(sidecar, _post(CHAT, extra)), 431, "headers_too_large")
    assert "10 header fields" in error["message"]


def test_a_silent_connection_is_closed_quietly(start_sidecar: Callable[..., AttestThread]) -> None:
    sidecar = start_sidecar(**SHORT)
    with connect(sidecar) as sock:
        assert read_to_end(sock) == b""


def test_a_slowloris_head_gets_408(start_sidecar: Callable[..., AttestThread]) -> None:
    sidecar = start_sidecar(**SHORT)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nx-slow: " + b"a" * 10_000
    with connect(sidecar) as sock:
        deadline = time.monotonic() + WAIT_S
        for byte in head:  # a byte every 50 ms until the sidecar answers
            assert time.monotonic() < deadline, "the sidecar kept a slowloris head open"
            if select.select([sock], [], [], 0.05)[0]:
                break
            sock.send(bytes([byte]))
        raw = read_to_end(sock)
    assert "head" in assert_refused(raw, 408, "request_timeout")["message"]


def test_a_stalled_body_gets_408(
    start_sidecar: Callable[..., AttestThread], tmp_path: Path
) -> None:
    sidecar = start_sidecar(**SHORT)
    raw = exchange(sidecar, _post(CHAT)[:-10])
    assert "body" in assert_refused(raw, 408, "request_timeout")["message"]
    sidecar.stop()
    assert _logged(tmp_path) == []


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_a_body_over_the_limit_is_413_before_it_is_read(
    start_sidecar: Callable[..., AttestThread], tmp_path: Path, chunked: bool
) -> None:
    sidecar = start_sidecar()
    big = b"x" * (MAX_BODY + 1)
    if chunked:
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big)
        )
    else:
        request = _post(big)
    error = assert_refused(exchange(sidecar, request), 413, "request_too_large")
    assert str(MAX_BODY) in error["message"]
    # a declared length far past the limit is refused before any body byte is sent
    raw = exchange(sidecar, b"POST / HTTP/1.1\r\ncontent-length: 1" + b"0" * 18 + b"\r\n\r\n")
    assert_refused(raw, 413, "request_too_large")
    sidecar.stop()
    assert _logged(tmp_path) == []


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GE\x01T /health HTTP/1.1\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nbad header\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS on a plain-text port
        b"POST http://elsewhere/v1/chat/completions HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\nx-label: phi\r\n\r\n",  # a trailer field
        b"GET /health HTTP/1.1\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    ],
    ids=[
        "request-line",
        "header",
        "chunked",
        "two-lengths",
        "tls",
        "absolute",
        "trailer",
        "upgrade",
    ],
)
def test_malformed_framing_gets_a_json_400(
    start_sidecar: Callable[..., AttestThread], tmp_path: Path, request_bytes: bytes
) -> None:
    sidecar = start_sidecar()
    assert_refused(exchange(sidecar, request_bytes), 400, "invalid_request")
    sidecar.stop()
    assert _logged(tmp_path) == []


def test_an_answer_to_head_has_no_body(start_sidecar: Callable[..., AttestThread]) -> None:
    # The relay answers HEAD 405. With its body written, a client on the connection (a
    # proxy that pools it for other clients) read those bytes as the start of the next
    # request's answer.
    sidecar = start_sidecar()
    raw = exchange(
        sidecar,
        b"HEAD /health HTTP/1.1\r\nhost: x\r\n\r\n"
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 ")
    assert rest.startswith(b"HTTP/1.1 200 "), rest[:80]  # right after the head


def test_a_connection_past_the_cap_drops_the_one_waiting_longest(
    start_sidecar: Callable[..., AttestThread],
) -> None:
    """Heads that never end hold every connection of the sidecar; requests that arrive
    whole are served, each dropping the connection that has waited longest. (Before, they
    were closed at once, unread, until the heads timed out: slow heads could keep the
    gateway out of its sidecar.)"""
    sidecar = start_sidecar(max_connections=4, header_timeout_s=300)
    held = [connect(sidecar) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: a")  # never ended
        for number in range(2):  # each time one heads slowly again: the cap is full
            raw = exchange(sidecar, b"GET /health HTTP/1.1\r\nconnection: close\r\n\r\n")
            assert raw, "closed unread at the cap"
            assert parse(raw)[0] == 200, raw[:200]
            assert read_to_end(held[number]) == b""  # the oldest, dropped unanswered
            held.append(connect(sidecar))
            held[-1].sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: a")
    finally:
        for sock in held:
            sock.close()


def test_a_sidecar_whose_key_cannot_be_read_exits_1(tmp_path: Path) -> None:
    argv = owngate_argv(
        "attest",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        "http://127.0.0.1:9",
        "--key",
        str(tmp_path / "missing.key"),
        "--log",
        str(tmp_path / "log"),
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert "missing.key" in done.stderr


def _tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The sidecar's server context, and a client context that trusts it."""
    now = datetime.now(UTC)
    ca = make_ca("test CA", now=now, days=1)
    issued = issue(ca, "sidecar.test", now=now, days=1)
    cert, key = tmp_path / "sidecar.pem", tmp_path / "sidecar-key.pem"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem)
    client = ssl.create_default_context(cafile=ca_file)
    return listener_context(cert, key), client


def test_a_silent_tls_handshake_is_cut_at_the_header_timeout(
    start_sidecar: Callable[..., AttestThread], tmp_path: Path
) -> None:
    """A client that opens a TLS connection and never says hello is closed like a silent
    plain one."""
    sidecar = start_sidecar(tls=_tls(tmp_path)[0], **SHORT)
    with connect(sidecar) as sock:
        assert read_to_end(sock) == b""  # closed within WAIT_S, not after 60 s


def test_tls_handshakes_count_against_the_connection_cap(
    start_sidecar: Callable[..., AttestThread], tmp_path: Path
) -> None:
    """A connection whose handshake has not happened holds a descriptor like any other:
    past the cap it is closed at once. It used to count only once its handshake was
    done, so peers that never said hello held as many descriptors as they could open,
    each for the whole handshake timeout."""
    server, client = _tls(tmp_path)
    sidecar = start_sidecar(tls=server, max_connections=4, header_timeout_s=60)
    silent = [connect(sidecar) for _ in range(24)]
    try:
        for sock in silent:
            sock.setblocking(False)
        closed: set[int] = set()

        def closed_by_the_sidecar() -> bool:
            for number, sock in enumerate(silent):
                if number not in closed and select.select([sock], [], [], 0)[0]:
                    try:
                        ended = sock.recv(1) == b""
                    except OSError:
                        ended = True
                    if ended:
                        closed.add(number)
            return len(closed) >= 20

        until(closed_by_the_sidecar, "all but 4 silent connections closed", timeout=WAIT_S)
        assert len(closed) == 20  # the 4 under the cap wait for their hello
        for number in sorted(set(range(len(silent))) - closed)[:1]:
            silent[number].close()  # one place under the cap is free again

        def served() -> bool:
            try:
                with (
                    connect(sidecar) as raw,
                    client.wrap_socket(raw, server_hostname="sidecar.test") as sock,
                ):
                    sock.sendall(b"GET /health HTTP/1.1\r\nconnection: close\r\n\r\n")
                    return read_to_end(sock).startswith(b"HTTP/1.1 200 ")
            except OSError:  # the sidecar has not seen the close yet: still at the cap
                return False

        until(served, "a TLS client served once a place is free", timeout=WAIT_S)
    finally:
        for sock in silent:
            sock.close()


def test_a_tls_connection_past_the_cap_drops_the_one_waiting_longest(
    start_sidecar: Callable[..., AttestThread], tmp_path: Path
) -> None:
    """The TLS acceptor makes room as the plain listener does: idle keep-alive TLS
    connections hold the cap; a new one is served and the oldest is dropped. (Before, it
    was closed at once.)"""
    server, client = _tls(tmp_path)
    sidecar = start_sidecar(tls=server, max_connections=2, header_timeout_s=300)
    held: list[ssl.SSLSocket] = []
    try:
        for _ in range(2):  # one after the other: a handshake ends before the next begins
            sock = client.wrap_socket(connect(sidecar), server_hostname="sidecar.test")
            held.append(sock)
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert read_answer(sock).startswith(b"HTTP/1.1 200 ")  # then idle, waiting
        with (
            connect(sidecar) as raw,
            client.wrap_socket(raw, server_hostname="sidecar.test") as sock,
        ):
            sock.sendall(b"GET /health HTTP/1.1\r\nconnection: close\r\n\r\n")
            assert read_to_end(sock).startswith(b"HTTP/1.1 200 ")
        assert read_to_end(held[0]) == b""  # dropped for it
        held[1].sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_answer(held[1]).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in held:
            sock.close()
