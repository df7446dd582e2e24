"""What the listener keeps of a connection its client reset.

uvicorn arms a keep-alive timer once an answer is complete, and cancels it when the
connection ends, but only when it ends cleanly: a connection the client resets
(`connection_lost` with an error) left the timer armed, and the timer held the whole
connection (its protocol, its request's head and scope, its transport) until
`listen.keepalive_timeout_s`, no longer counted against the connection cap. No key is
needed: connections that each send a 27 KB head, read the 401 and reset held 47 KB each
in a real gateway (140 MB after 3,000 in 20 s from one client; tracemalloc) for the 30 s
default. The listener now cancels it at every end (`gateway/listener_limits.py`
`cancel`). The keep-alive is set long here, so the wait below never outlasts it.

uvloop closes a connection its client reset at once and tells the protocol a turn later;
an answer written in between raised out of the app's `send`, and the request was
recorded as the gateway's fault (500, committing to an answer the client never got):
98 of 200 pipelined answers after a reset were. It is now a client that left (499,
committing to nothing; gateway/coalescing.py `mark_lost`).
"""

from __future__ import annotations

import gc
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import admin_app, create_app
from gateway.config.schema import ListenSettings
from gateway.listener import LimitedHttpProtocol
from gateway.provenance.witness.app import create_witness_app
from gateway.serving import ServerThread
from tests.helpers.gateways import (
    TENANT_KEY,
    Gateway,
    Sim,
    backend,
    gateway_config,
    logged_private_gateway,
)
from tests.helpers.provenance import records
from tests.helpers.raw_socket import connect, read_answer
from tests.helpers.waiting import until
from tests.helpers.witness_rig import open_witness

_CONNECTIONS = 20
_BIG_HEAD = b"".join(b"x-h%d: %s\r\n" % (i, b"a" * 300) for i in range(90))
_KEYLESS = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 2\r\n" + _BIG_HEAD
) + b"\r\n{}"
_CHAT = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'
_KEYED = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: %d\r\n"
    b"authorization: Bearer %s\r\n\r\n%s" % (len(_CHAT), TENANT_KEY.encode(), _CHAT)
)


@pytest.fixture
def gateway(start_sim: Callable[..., Sim]) -> Iterator[ServerThread]:
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
    listen: dict[str, Any] = {"keepalive_timeout_s": 3600}
    config = gateway_config([backend("gpu", sim.url, "sim-model")], listen=listen)
    server = ServerThread(create_app(config, environ={}), listen=config.listen).start()
    yield server
    server.stop()


def _held(clients: set[tuple[str, int]]) -> int:
    """How many listener connections of `clients` (their local addresses) still exist."""
    gc.collect()  # a connection and its request cycle refer to each other
    return sum(
        1
        for thing in gc.get_objects()
        if isinstance(thing, LimitedHttpProtocol) and getattr(thing, "client", None) in clients
    )


@pytest.mark.parametrize(
    ("request_bytes", "status"), [(_KEYLESS, b" 401 "), (_KEYED, b" 200 ")], ids=["401", "200"]
)
def test_a_connection_reset_after_its_answer_is_not_kept(
    gateway: ServerThread, request_bytes: bytes, status: bytes
) -> None:
    _reset_after_answers(gateway, request_bytes, status)


@pytest.mark.parametrize("listener", ["admin", "witness"])
def test_the_admin_and_witness_listeners_free_a_connection_reset_after_its_answer(
    start_sim: Callable[..., Sim], tmp_path: Path, listener: str
) -> None:
    """They serve with the same protocol (`gateway.serving.uvicorn_config`): an answer
    that needs no token (the admin API's 401, the witness's 404) armed the same timer."""
    listen = ListenSettings(keepalive_timeout_s=3600)
    if listener == "admin":
        sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
        config = gateway_config([backend("gpu", sim.url, "sim-model")])
        app: Any = admin_app(create_app(config, environ={}))
        request = b"GET /admin/v1/log/cosignatures HTTP/1.1\r\nhost: g\r\n" + _BIG_HEAD + b"\r\n"
        status = b" 401 "
    else:
        app = create_witness_app(open_witness(tmp_path / "witness.json"))
        request = b"GET /nothing-here HTTP/1.1\r\nhost: g\r\n" + _BIG_HEAD + b"\r\n"
        status = b" 404 "
    with ServerThread(app, listen=listen, lifespan="off") as server:
        _reset_after_answers(server, request, status)


def _reset_after_answers(server: ServerThread, request_bytes: bytes, status: bytes) -> None:
    """`_CONNECTIONS` connections that each send `request_bytes`, read the answer (its
    status line holds `status`) and reset: none may be held after."""
    clients: set[tuple[str, int]] = set()
    for _ in range(_CONNECTIONS):
        sock = connect(server)
        try:
            sock.sendall(request_bytes)
            answer = read_answer(sock)  # complete: the keep-alive timer is armed now
            assert status in answer.split(b"\r\n", 1)[0], answer[:200]
            host, port = sock.getsockname()[:2]
            clients.add((host, port))
            # a reset, not a FIN: the client's close with SO_LINGER 0
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            sock.close()
    until(
        lambda: _held(clients) == 0,
        "every reset connection freed, long before its keep-alive timeout",
        detail=lambda: f"{_held(clients)} of {_CONNECTIONS} still held",
    )


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_answers_to_a_client_that_reset_are_recorded_as_a_client_that_left(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = logged_private_gateway(start_gateway, tmp_path, sim.url, "test/resets")
    chat = _CHAT.replace(b"sim-model", b"m")
    one = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: %d\r\n"
        b"authorization: Bearer %s\r\n\r\n%s" % (len(chat), TENANT_KEY.encode(), chat)
    )
    for _ in range(_CONNECTIONS):
        sock = connect(gateway.server)
        try:
            sock.sendall(one * 3)  # pipelined: the later answers meet the reset
            assert sock.recv(100).startswith(b"HTTP/1.1 200 ")
        finally:
            _reset(sock)
    log = tmp_path / "log"

    def completions() -> list[dict[str, Any]]:
        return [r for r in records(log) if r.get("type") == "completion"]

    until(
        lambda: len(completions()) == sum(1 for r in records(log) if r.get("type") == "dispatch"),
        "every dispatched request completed",
    )
    statuses = sorted({r["status"] for r in completions()})
    assert set(statuses) <= {200, 499}, statuses  # never the gateway's fault (500)
    for record in completions():
        if record["status"] == 499:
            assert record.get("response_commitment") is None, record


@pytest.mark.parametrize("body_bytes", [0, 70_000], ids=["head", "past-64KiB"])
def test_a_connection_reset_during_a_pipelined_requests_body_is_not_kept(
    gateway: ServerThread, body_bytes: int
) -> None:
    """A second request pipelined behind the first, its head (and part of its body, up to
    past the 64 KiB uvicorn buffers before pausing reading) sent, its body never ended:
    the reset frees the connection, its queued request and its body deadline with it."""
    pipelined = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 200000\r\n"
        + _BIG_HEAD
        + b"\r\n"
        + b"x" * body_bytes
    )
    _reset_after_answers(gateway, _KEYLESS + pipelined, b" 401 ")
