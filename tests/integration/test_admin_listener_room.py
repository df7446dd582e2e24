"""The admin API's listener makes room at its connection cap (`gateway/listener_room.py`).

Its 32 connections are taken before any token is checked. Closing each connection past
the cap let a peer with no token hold them all (heads sent slowly, sockets left silent,
bodies of refused requests trickled in, reconnecting at each deadline) and keep
operators out. Now a connection past the cap drops one waiting for a request of its own
(of one peer, as here: the one that has waited longest), and one whose request is being
answered is never dropped. The public listener has the same protocol class
(tests/integration/test_listener_room.py).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from uvicorn.server import ServerState

from gateway.config.schema import ListenSettings
from gateway.listener import http_protocol
from gateway.listener_limits import ADMIN_MAX_CONNECTIONS
from tests.helpers.admin import serve_admin
from tests.helpers.protocol_wire import Wire, connect_protocol, finish
from tests.helpers.raw_socket import WAIT_S, read_answer, read_to_end

_GET = b"GET /x HTTP/1.1\r\nhost: g\r\n\r\n"
_SLOW_HEAD = b"GET /x HTTP/1.1\r\nhost: g\r\nx-slow: a"  # never ended


def _app(release: asyncio.Event) -> Any:
    """Answers at once without reading the body, or (`/hold`) once `release` is set."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/hold":
            await release.wait()
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def test_a_connection_past_the_cap_drops_the_one_waiting_longest() -> None:
    """Three connections waiting, each in another way: the rest of an answered request's
    body still coming, idle after an answer, a head arriving. Each newcomer is served
    and drops the one that began waiting first."""

    async def run() -> tuple[list[list[bool]], list[bytes]]:
        app = _app(asyncio.Event())
        state = ServerState()
        http = http_protocol(ListenSettings(max_connections=3))
        held: list[Wire] = []
        for first in (
            b"POST /x HTTP/1.1\r\nhost: g\r\ncontent-length: 100000\r\n\r\n{",
            _GET,
            _GET,
        ):
            protocol, wire, tasks = connect_protocol(app, state=state, http=http)
            protocol.data_received(first)
            await finish(tasks)
            assert wire.out.startswith(b"HTTP/1.1 200")
            held.append(wire)
        protocol.data_received(_SLOW_HEAD)  # the last one's next head, still arriving
        closed, answers = [], []
        for _ in range(3):
            protocol, wire, tasks = connect_protocol(app, state=state, http=http)
            protocol.data_received(_GET)
            await finish(tasks)
            closed.append([w.closed for w in held])
            answers.append(bytes(wire.out))
        assert len(state.connections) == 3
        return closed, answers

    closed, answers = asyncio.run(run())
    assert closed == [[True, False, False], [True, True, False], [True, True, True]]
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)


def test_a_connection_being_answered_is_never_dropped() -> None:
    async def run() -> tuple[bool, list[bool], list[bytes]]:
        release = asyncio.Event()
        app = _app(release)
        state = ServerState()
        http = http_protocol(ListenSettings(max_connections=2))
        busy: list[Wire] = []
        tasks: set[Any] = set()
        for _ in range(2):
            protocol, wire, tasks = connect_protocol(app, state=state, http=http)
            protocol.data_received(b"GET /hold HTTP/1.1\r\nhost: g\r\n\r\n")
            busy.append(wire)
        _, extra, _ = connect_protocol(app, state=state, http=http)
        refused = extra.closed and not extra.out
        release.set()
        await finish(tasks)
        return refused, [w.closed for w in busy], [bytes(w.out) for w in busy]

    refused, busy_closed, answers = asyncio.run(run())
    assert refused  # no room: closed at once, unread, as before
    assert busy_closed == [False, False]
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)


def test_a_client_reading_none_of_its_answers_makes_way_when_none_waits() -> None:
    """Every connection is being answered, so none waits; the clients of two have stopped
    reading (the transport paused writing: their buffers are full, as a client with a
    tiny receive buffer pipelining keyless `GET /openapi.json` gets them). A newcomer is
    served and drops the one stalled longest; one whose client reads again (writing
    resumed) is kept. (Before, the newcomer was closed unread until `write_timeout_s`.)"""

    async def run() -> tuple[list[bool], bytes, list[bytes]]:
        release, answered = asyncio.Event(), asyncio.Event()
        started: list[asyncio.Event] = []

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            headers = [(b"content-length", b"4")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            if scope["path"] != "/big":
                await send({"type": "http.response.body", "body": b"okok"})
                answered.set()
                return
            # An answer begun, and (below) not read by the client: the app is held in it.
            await send({"type": "http.response.body", "body": b"ok", "more_body": True})
            started[-1].set()
            await release.wait()
            await send({"type": "http.response.body", "body": b"ok"})

        state = ServerState()
        http = http_protocol(ListenSettings(max_connections=3))
        held: list[tuple[Any, Wire]] = []
        tasks: set[Any] = set()
        for _ in range(3):
            started.append(asyncio.Event())
            protocol, wire, tasks = connect_protocol(app, state=state, http=http)
            protocol.data_received(b"GET /big HTTP/1.1\r\nhost: g\r\n\r\n")
            await asyncio.wait_for(started[-1].wait(), WAIT_S)
            held.append((protocol, wire))
        held[1][0].pause_writing()  # stalled first
        held[0][0].pause_writing()
        held[2][0].pause_writing()
        held[2][0].resume_writing()  # reads again
        protocol, wire, tasks = connect_protocol(app, state=state, http=http)
        assert not wire.closed, "closed unread at the cap"
        protocol.data_received(_GET)
        await asyncio.wait_for(answered.wait(), WAIT_S)  # the others are still held
        first = [w.closed for _, w in held]
        answer = bytes(wire.out)
        held[0][0].resume_writing()  # its client reads again: its answer ends
        release.set()
        await finish(tasks)
        return first, answer, [bytes(w.out) for _, w in held]

    first, answer, answers = asyncio.run(run())
    assert first == [False, True, False]
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"okok")
    assert all(answers[i].startswith(b"HTTP/1.1 200") for i in (0, 2))
    assert all(answers[i].endswith(b"okok") for i in (0, 2))
    assert not answers[1].endswith(b"okok")  # dropped with its answer unfinished


def test_operators_get_in_while_keyless_slow_heads_hold_every_admin_connection(
    tmp_path: Path,
) -> None:
    """`owngate serve`: a peer with no token takes all 32 connections of the admin
    listener (each answered 401 once, then a head that never ends); an operator's
    request is still served, and the connection that waited longest is dropped for it.
    (Before, the operator's connection was closed unread until the heads timed out, and
    the peer reconnected.)"""
    with serve_admin(tmp_path, listen={"header_timeout_s": 300}) as served:
        address = urlsplit(served.admin)
        held = []
        try:
            for _ in range(ADMIN_MAX_CONNECTIONS):
                sock = socket.create_connection((address.hostname, address.port), WAIT_S)
                held.append(sock)
                sock.sendall(b"GET /admin/v1/status HTTP/1.1\r\nhost: admin\r\n\r\n")
                assert read_answer(sock).startswith(b"HTTP/1.1 401 ")  # accepted, kept alive
                sock.sendall(b"GET /admin/v1/status HTTP/1.1\r\nhost: admin\r\nx-slow: a")
            assert served.get("/admin/v1/status", "operator").status_code == 200
            assert read_to_end(held[0]) == b""  # dropped for it, unanswered
        finally:
            for sock in held:
                sock.close()
