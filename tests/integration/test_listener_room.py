"""The public listener makes room at its connection cap (`gateway/listener_room.py`).

Its connections are taken before any key is checked. Closing each connection past the
cap let one client hold them all with heads that never end, reconnecting at each
deadline: 250 slow heads from one address against `max_connections: 200` left 0 of 27
requests served. Now a connection past the cap drops one waiting for a request of its own
(of the peer address holding the most, its oldest) and is served; one whose request is
being answered is never dropped. Sources are loopback addresses (127.0.0.1, .2, .3).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from gateway.app import create_app
from gateway.config.schema import ListenSettings
from gateway.listener import LimitedHttpProtocol
from gateway.serving import ServerThread
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.raw_socket import WAIT_S, connect, exchange, parse, read_answer, read_to_end
from tests.helpers.waiting import until

HEALTHZ = b"GET /healthz HTTP/1.1\r\nhost: g\r\n\r\n"
SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nhost: g\r\nx-slow: a"  # never ended
CHAT = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'


def _chat(model: bytes, key: str, *more_headers: bytes) -> tuple[bytes, bytes]:
    """The head (with `more_headers`) and body of a chat completion request."""
    body = CHAT % model
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + key.encode() + b"\r\n"
        b"content-length: %d\r\n" % len(body) + b"".join(h + b"\r\n" for h in more_headers)
    )
    return head + b"\r\n", body


def _connect_from(source: str, port: int) -> socket.socket:
    """A connection to the listener on 127.0.0.1:`port` from the loopback address `source`."""
    return socket.create_connection(("127.0.0.1", port), WAIT_S, source_address=(source, 0))


def test_slow_heads_at_the_cap_do_not_lock_a_prompt_request_out(
    process: Callable[..., GatewayProcess],
) -> None:
    """`owngate serve`: one address holds every connection left with heads that never end
    (each asked once first, so it is surely accepted); requests from another address
    that arrive whole are served, each dropping the flooding address's oldest
    connection, never another client's idle keep-alive, though it is the oldest of all.
    (Before, they were closed unread until the heads timed out, and the flood
    reconnected.)"""
    listen = {"host": "127.0.0.1", "port": free_port(), "max_connections": 8}
    gateway = process(listen={**listen, "header_timeout_s": 300}).start()
    keepalive = _connect_from("127.0.0.2", gateway.port)
    flood: list[socket.socket] = []
    try:
        keepalive.sendall(HEALTHZ)
        assert read_answer(keepalive).startswith(b"HTTP/1.1 200 ")
        for _ in range(7):  # with the keep-alive: the cap
            sock = _connect_from("127.0.0.1", gateway.port)
            flood.append(sock)
            sock.sendall(HEALTHZ)
            assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
            sock.sendall(SLOW_HEAD)
        head, body = _chat(b"m", KEY, b"connection: close")
        for _ in range(3):
            with _connect_from("127.0.0.3", gateway.port) as sock:
                sock.sendall(head + body)
                raw = read_to_end(sock)
            assert raw, "closed unread at the cap"
            assert parse(raw)[0] == 200, raw[:300]
        assert read_to_end(flood[0]) == b""  # dropped for the first, unanswered
        keepalive.sendall(HEALTHZ)  # the oldest connection, never dropped
        assert read_answer(keepalive).startswith(b"HTTP/1.1 200 ")
    finally:
        keepalive.close()
        for sock in flood:
            sock.close()


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


def test_new_connections_drop_the_silent_ones_oldest_first(
    start_listener: Callable[..., ServerThread],
) -> None:
    """Eight silent connections hold the cap; each newcomer (kept open after its answer,
    so the count stays at the cap) is served and drops the oldest silent one."""
    server = start_listener(max_connections=8, header_timeout_s=30)
    held = [connect(server) for _ in range(8)]  # accepted in this order
    newcomers: list[socket.socket] = []
    try:
        for n in range(3):
            sock = connect(server)
            newcomers.append(sock)
            sock.sendall(HEALTHZ)
            assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
            assert read_to_end(held[n]) == b""  # dropped, nothing sent
        for sock in held[3:] + newcomers:  # the others are still served
            sock.sendall(HEALTHZ)
            assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in held + newcomers:
            sock.close()


def test_a_new_connection_is_closed_when_every_connection_is_answered(
    start_listener: Callable[..., ServerThread],
) -> None:
    """Four requests are being answered (the gateway asked for their bodies: `100
    Continue`): a fifth connection is closed at once, unread, and none of the four is
    dropped. Once answered they wait for a request, and a new connection makes room."""
    server = start_listener(max_connections=4, header_timeout_s=30)
    head, body = _chat(b"sim-model", TENANT_KEY, b"expect: 100-continue")
    held = []
    try:
        for _ in range(4):
            sock = connect(server)
            held.append(sock)
            sock.sendall(head)
            assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        with connect(server) as extra:
            assert read_to_end(extra) == b""  # closed at once, nothing read
        for sock in held:
            sock.sendall(body)
            assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
        raw = exchange(server, b"GET /healthz HTTP/1.1\r\nhost: g\r\nconnection: close\r\n\r\n")
        assert parse(raw)[0] == 200
    finally:
        for sock in held:
            sock.close()


async def _large_answers(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """`/big`: 16 MiB in 64 KiB pieces (each `send` waits while the client reads nothing);
    anything else: "ok"."""
    if scope["type"] != "http":
        return
    big = scope["path"] == "/big"
    size, piece = (16 << 20, b"x" * 65536) if big else (2, b"ok")
    headers = [(b"content-length", b"%d" % size)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for sent in range(0, size, len(piece)):
        more = sent + len(piece) < size
        await send({"type": "http.response.body", "body": piece, "more_body": more})


def test_clients_reading_none_of_their_answers_make_way_at_the_cap() -> None:
    """Every connection's request is being answered, to a client with a tiny receive
    buffer that reads nothing (as keyless pipelined `GET /openapi.json` on the admin
    listener can do): the server's writes to each are paused. A newcomer is served,
    dropping one of them. (Before, nothing waited for a request, so the newcomer was
    closed unread until `write_timeout_s`, 120 s: operators were locked out.)"""
    server = ServerThread(_large_answers, listen=ListenSettings(max_connections=4)).start()
    state = server._server.server_state  # uvicorn's: the open connections' protocols
    stalled = []
    try:
        for _ in range(4):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.settimeout(WAIT_S)
            stalled.append(sock)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(b"GET /big HTTP/1.1\r\nhost: g\r\n\r\n")

        def paused() -> bool:
            protocols = cast("list[LimitedHttpProtocol]", list(state.connections))
            return sum(protocol.flow.write_paused for protocol in protocols) == 4

        until(paused, "the server's writes to all 4 paused", timeout=30)
        raw = exchange(server, b"GET /small HTTP/1.1\r\nhost: g\r\nconnection: close\r\n\r\n")
        assert raw, "closed unread at the cap"
        assert parse(raw)[0] == 200
    finally:
        for sock in stalled:
            sock.close()
        server.stop()


WHOLE = 8 << 20  # `/whole`'s answer: one `http.response.body`


async def _whole_answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """`/whole`: `WHOLE` bytes in one piece (the transport buffers what the client has not
    read yet); anything else: "ok"."""
    if scope["type"] != "http":
        return
    body = b"x" * WHOLE if scope["path"] == "/whole" else b"ok"
    headers = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def test_a_whole_answer_still_going_out_is_not_cut_to_make_room() -> None:
    """A's whole answer is complete for the server but mostly still in the transport's
    buffer; B connects after it, idle. A newcomer at the cap drops B, not A (the oldest
    "waiting" before: its download was cut off, 2.8 of 8 MiB, an answer logged as
    delivered), and A reads every byte."""
    server = ServerThread(_whole_answer, listen=ListenSettings(max_connections=2)).start()
    state = server._server.server_state  # uvicorn's: the open connections' protocols
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    reader.settimeout(WAIT_S)
    idle = None
    try:
        reader.connect(("127.0.0.1", server.port))
        reader.sendall(b"GET /whole HTTP/1.1\r\nhost: g\r\n\r\n")

        def still_sending() -> bool:
            protocols = cast("list[LimitedHttpProtocol]", list(state.connections))
            return any(
                p.cycle is not None
                and p.cycle.response_complete
                and p.transport.get_write_buffer_size() > 0
                for p in protocols
            )

        until(still_sending, "A's answer complete, its bytes still buffered", timeout=30)
        idle = connect(server)
        until(lambda: len(state.connections) == 2, "B accepted", timeout=30)
        raw = exchange(server, b"GET /small HTTP/1.1\r\nhost: g\r\nconnection: close\r\n\r\n")
        assert raw, "closed unread at the cap"
        assert parse(raw)[0] == 200
        assert read_to_end(idle) == b""  # B made room, nothing sent
        data = bytearray()
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + WHOLE:
            piece = reader.recv(1 << 20)
            if not piece:
                break
            data += piece
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert len(body) == WHOLE, f"A got {len(body)} of {WHOLE} bytes"
    finally:
        reader.close()
        if idle is not None:
            idle.close()
        server.stop()
