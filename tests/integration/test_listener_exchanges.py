"""How the public listener (`gateway.listener`) ends one exchange before the next, over
raw sockets: an answer given before a request's body was asked for, and the order of
what goes out when a refusal follows an answer on the same connection.

A client's next request must never be read as the body of one it was already answered
for, and a refusal must never overtake an answer still held for coalescing
(gateway/coalescing.py).
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Iterator

import pytest

from gateway.app import create_app
from gateway.listener_limits import MAX_PIPELINED
from gateway.serving import ServerThread
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.raw_socket import WAIT_S, assert_refused, connect, parse, read_to_end

CHAT = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'


@pytest.fixture
def gateway(start_sim: Callable[..., Sim]) -> Iterator[ServerThread]:
    """A gateway in front of one simulator, with the default (long) body deadline: a
    connection that stays open waiting for a body outlives every bounded read here."""
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
    config = gateway_config([backend("gpu", sim.url, "sim-model")])
    server = ServerThread(create_app(config, environ={}), listen=config.listen).start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "auth",
    [b"", b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"],
    ids=["401-before-the-body", "413-before-the-body"],
)
def test_an_answer_before_a_100_continue_body_closes_the_connection(
    gateway: ServerThread, auth: bytes
) -> None:
    """A client that sent `Expect: 100-continue` and got a final answer instead sends no
    body (RFC 9110, 10.1.1). The gateway used to keep waiting for it on a keep-alive
    connection: the client's next request was read as that body and dropped unanswered
    (behind a proxy that reuses the connection, someone else's request, or the tail of
    one parsed as a request of its own). The answer says `connection: close` and the
    connection ends with it."""
    length = 9_000_000 if auth else len(CHAT)  # past limits.max_body_bytes: 413
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
        + auth
        + b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % length
    )
    with connect(gateway) as sock:
        sock.sendall(head)
        first = sock.recv(65536)
        status, headers, _ = parse(first)
        assert status == (413 if auth else 401)
        assert headers.get("connection") == "close"
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
        assert read_to_end(sock) == b""  # closed, never read as the body


def test_a_100_continue_request_that_is_read_is_served_and_kept_alive(
    gateway: ServerThread,
) -> None:
    """A body the gateway asked for (`100 Continue`) is read as usual and the connection
    stays open for the next request."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
        b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"
        b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(CHAT)
    )
    with connect(gateway) as sock:
        sock.sendall(head)
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(CHAT + b"GET /healthz HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
        raw = read_to_end(sock)
    assert raw.count(b"HTTP/1.1 200 OK") == 2
    assert b"connection: close" in raw.split(b"HTTP/1.1 200 OK")[2]


def _pipeline(server: ServerThread, total: int) -> tuple[int, int]:
    """Send small pipelined requests, up to `total` bytes, reading what comes back, until
    the server closes; returns (bytes sent, answers received)."""
    request = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n"
    batch = request * 2000
    sent, answered = 0, 0
    deadline = time.monotonic() + WAIT_S
    with connect(server) as sock:
        while sent < total and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                try:
                    data = sock.recv(1 << 20)
                except ConnectionResetError:
                    break
                if not data:
                    break
                answered += data.count(b"HTTP/1.1 200 OK")
            if writable:
                try:
                    sent += sock.send(batch)
                except (BrokenPipeError, ConnectionResetError):
                    break
    return sent, answered


def test_pipelined_requests_are_bounded_per_connection(gateway: ServerThread) -> None:
    """uvicorn parses every request in a read and queues each behind the one running, and
    reads again after each answer: one connection sending small requests without end
    queued hundreds of thousands of them (600 MB in seconds, the loop starved). Past
    `MAX_PIPELINED` queued requests the connection is closed."""
    sent, answered = _pipeline(gateway, 50_000_000)
    assert sent < 5_000_000, f"{sent} bytes of pipelined requests read, {answered} answered"
    assert answered <= MAX_PIPELINED + 1


def test_a_few_pipelined_requests_are_all_answered(gateway: ServerThread) -> None:
    request = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n"
    last = b"GET /healthz HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n"
    with connect(gateway) as sock:
        sock.sendall(request * (MAX_PIPELINED - 1) + last)
        raw = read_to_end(sock)
    assert raw.count(b"HTTP/1.1 200 OK") == MAX_PIPELINED


def test_a_request_past_the_pipelining_bound_is_refused_after_the_answers_queued(
    gateway: ServerThread,
) -> None:
    """One request more than the bound: the request being answered and the
    `MAX_PIPELINED` queued behind it are answered, then the one past it gets 400 and the
    connection closes. The connection used to be closed at once, every answer unsent."""
    request = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n"
    with connect(gateway) as sock:
        sock.sendall(request * (MAX_PIPELINED + 2))
        raw = read_to_end(sock)
    *answers, refusal = raw.split(b"HTTP/1.1 ")[1:]
    assert [a[:6] for a in answers] == [b"200 OK"] * (MAX_PIPELINED + 1), raw[:400]
    assert_refused(b"HTTP/1.1 " + refusal, 400, "invalid_request")
