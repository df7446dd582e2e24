"""A client that read the whole answer and then closed got the whole answer.

The completion of an answer waits until the kernel took every byte of it (none left in the
gateway's own write buffer: `BodyWriter.taken`, tests/integration/test_log_truth_killed_unread.py,
test_log_truth_stream_end_unread.py). Below the mark that pauses writing no event says when
the kernel took the tail, so the wait looks at the buffer again and again (10 ms, doubling
to 1 s). A client that read slower than it was answered, took the last bytes and closed
between two looks was recorded 499, committing to no answer, though it got all of it:
once the connection is lost, uvloop reports an empty buffer, and the wait could not tell
"all taken" from "lost". Now the listener notes at the client's EOF (or a loss without an
error) what was left in the buffer (`ConnectionLoss.note`): 200, committing to the
answer it read. A client that resets with the answer's tail unread is 499, as before.

The race is made certain here: the wait's next look comes only once the connection ended
(its sleep waits for the listener's `connection_lost`), and the kernel's buffers for the
connection are small (the client's receive buffer, the gateway's send buffer), so that an
answer under the pause mark leaves a tail in the gateway's buffer until the client reads.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import body_writer
from gateway.listener import LimitedHttpProtocol
from gateway.provenance import commit
from tests.helpers.audit_rig import chunked, writes
from tests.helpers.gateways import Gateway, logged_private_gateway
from tests.helpers.log_truth import CHAT, DONE, EVENT, ORIGIN, salt_of, stream_receipt
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, RawBackend, completion_body, json_answer
from tests.helpers.raw_socket import request_id_of

# Some 40 KB: more than the kernel's buffers for the connection hold (made small below),
# less than the write buffer's mark that pauses writing (64 KiB): a tail stays in the
# gateway's buffer, which the wait for it looks at again and again.
WHOLE = completion_body("x" * 40_000)
BIG = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % (b"x" * 8000)
EVENTS = 5


class LookAfterEnd:
    """The wait for an answer's tail (`BodyWriter.taken`) looks again only once the
    client's connection ended; `looking` is set when it first waits for a tail (the
    client has not read it yet). Each accepted connection gets a small send buffer."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.looking = threading.Event()
        ended = asyncio.Event()
        made, lost = LimitedHttpProtocol.connection_made, LimitedHttpProtocol.connection_lost

        def connection_made(protocol: Any, transport: Any) -> None:
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            made(protocol, transport)

        def connection_lost(protocol: Any, exc: Exception | None) -> None:
            lost(protocol, exc)
            ended.set()

        async def sleep(_delay: float) -> None:
            self.looking.set()
            await ended.wait()

        monkeypatch.setattr(LimitedHttpProtocol, "connection_made", connection_made)
        monkeypatch.setattr(LimitedHttpProtocol, "connection_lost", connection_lost)
        monkeypatch.setattr(body_writer, "asyncio", types.SimpleNamespace(sleep=sleep))


def _ask(port: int, key: str, ask: dict[str, Any]) -> socket.socket:
    """A connection with a small receive buffer that sent `ask` and reads nothing yet."""
    body = json.dumps(ask).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (key.encode(), len(body), body)
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request)
    return sock


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """Read one answer whole, in small reads: its head and its body (de-chunked)."""
    got = b""
    while b"\r\n\r\n" not in got:
        got += _recv(sock)
    head, _, rest = got.partition(b"\r\n\r\n")
    fields = dict(
        (name.strip().lower(), value.strip())
        for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    )
    if b"content-length" in fields:
        length = int(fields[b"content-length"])
        while len(rest) < length:
            rest += _recv(sock)
        return head, rest
    body = b""
    while True:  # chunked: size line, data, CRLF ... until the last chunk and its CRLF
        while b"\r\n" not in rest:
            rest += _recv(sock)
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        while len(rest) < size + 2:
            rest += _recv(sock)
        body, rest = body + rest[:size], rest[size + 2 :]
        if size == 0:
            assert rest == b"", rest
            return head, body


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(1024)
    assert data, "the gateway closed before the answer ended"
    return data


def _tail_waiting(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> socket.socket:
    """A connection whose answer (a stream, or whole) ended with a tail in the gateway's
    write buffer, which the gateway waits for the kernel to take (`LookAfterEnd`)."""
    race = LookAfterEnd(monkeypatch)
    answer = writes(*chunked(EVENT, *[BIG] * EVENTS, DONE)) if stream else json_answer(WHOLE)
    raw = start_raw(answer)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    ask = CHAT if stream else {**CHAT, "stream": False}
    sock = _ask(gateway.server.port, gateway.key, ask)
    assert race.looking.wait(60), "the kernel took the whole answer: no tail to wait for"
    return sock


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_client_that_read_the_whole_answer_and_closed_is_recorded_as_answered(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    """The client reads the whole answer (slowly: its tail waited in the gateway's write
    buffer) and closes; the wait looks again only after that. Before: 499, no answer."""
    sock = _tail_waiting(start_raw, start_gateway, tmp_path, monkeypatch, stream)
    try:
        head, body = _read_answer(sock)
    finally:
        sock.close()  # a clean close: nothing of the answer left unread
    assert head.startswith(b"HTTP/1.1 200"), head
    if stream:
        seen = body.split(b": owngate-receipt ")[0]
        assert seen.endswith(DONE), seen[-200:]
        request_id, salt = salt_of(stream_receipt(body))
    else:
        receipt = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"x-owngate-receipt:")
        )
        seen = body
        request_id, salt = salt_of(base64.b64decode(receipt))
    assert request_id == request_id_of(head)
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["response_commitment"]) == (
        200,
        commit("response", salt, seen),
    ), f"the client read all {len(body)} bytes of the answer; the log says {record}"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_client_that_resets_with_the_answer_unread_is_a_client_that_left(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    """The same answer, its tail still in the gateway's write buffer, and a client that
    resets (linger 0) having read none of it: 499, committing to no answer (a stream: to
    what went out before its end, which is not the whole stream)."""
    sock = _tail_waiting(start_raw, start_gateway, tmp_path, monkeypatch, stream)
    try:
        head = sock.recv(4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()  # a reset: what the gateway still buffers never reaches the client
    record = completion_record(tmp_path / "log", request_id_of(head))
    assert record["status"] == 499, record
    if not stream:
        assert record["response_commitment"] is None, record
