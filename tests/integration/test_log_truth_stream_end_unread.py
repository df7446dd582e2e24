"""A stream's end still in the gateway's own write buffer is not an end the client got.

The gateway relays a stream to a client that stopped reading near its end (its socket
buffers full: a small receive buffer here, and a small send buffer on the gateway's side,
so that a short stream does it without bending the flow control): the backend's last
events, `[DONE]` and the gateway's receipt line are handed to the connection and stay in
its write buffer in the gateway's process, under the mark that pauses the relay, so the
stream ends. Before, its completion record said 200 and committed to the whole stream as
soon as its end was handed to that buffer; the client then reset (or the gateway died)
and got none of that tail, while the signed log said it got all of it. Now, as for a
whole answer (tests/integration/test_log_truth_killed_unread.py), the completion waits
until the kernel took the stream's end: a connection lost first is a client that left,
499, also when a later request of the connection (pipelined, or sent once the stream's
end went to the connection) is the one being answered as it goes (`ConnectionLoss`).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import body_writer
from gateway.api import passthrough, stream_relay, stream_writes
from tests.helpers.audit_rig import chunked, logged, request_log, settled, writes
from tests.helpers.gateways import Gateway, backend
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.provenance import records, run_audit_output
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.raw_socket import request_id_of, stalled_chat
from tests.helpers.waiting import until

# Some 48 KB of events: more than the kernel takes towards a client that reads nothing
# (the buffers made small below), less than the write buffer's mark that pauses the relay
# (64 KiB): the stream ends with its tail in the gateway's write buffer.
BIG = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % (b"x" * 8000)
EVENTS = 6


class EndSeen:
    """The relayed stream at its end: set once the gateway handed the first stream's end
    (its last ASGI message) to the connection, with what the connection's write buffer in
    the gateway's process held then (`BodyWriter.unsent`). The kernel's buffers for the
    client's connection are made small (the gateway's send buffer: loopback's grows to
    megabytes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.handed = threading.Event()
        self.unsent: list[int] = []
        start_stream, end_stream = stream_writes.start_stream, stream_writes.end_stream

        async def starting(send: Any, exchange: Any, *args: Any) -> None:
            cycle = exchange.writer.cycle_ref()
            transport = getattr(cycle.transport, "_transport", cycle.transport)
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            await start_stream(send, exchange, *args)

        async def ending(send: Any, exchange: Any, **kwargs: Any) -> None:
            async def sending(message: Any) -> None:
                await send(message)
                if not message.get("more_body") and not self.handed.is_set():
                    self.unsent.append(exchange.writer.unsent)
                    self.handed.set()

            await end_stream(sending, exchange, **kwargs)

        monkeypatch.setattr(stream_relay, "start_stream", starting)
        monkeypatch.setattr(passthrough, "end_stream", ending)


def _chat(key: str, more: bytes = b"") -> bytes:
    body = json.dumps(CHAT).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n%s"
        b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (more, key.encode(), len(body), body)
    )


@pytest.mark.parametrize(
    ("later", "done"),
    [(None, DONE), ("pipelined", DONE), ("keep-alive", DONE), (None, b"")],
    ids=["alone", "pipelined", "keep-alive", "no-done"],
)
def test_a_stream_whose_end_the_client_never_took_is_not_recorded_whole(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    later: str | None,
    done: bytes,
) -> None:
    """The stream ends (the backend's `[DONE]`, its last chunk) while its tail sits in the
    gateway's write buffer; the client, which read only the head, resets: it never got
    `[DONE]` nor the receipt line. Before, 200. `later`: another request on the same
    connection, sent with the first (pipelined) or once the first stream's end went to the
    connection (keep-alive), is answered behind it when the connection goes. `no-done`: a
    stream its backend ended (its last chunk) without `[DONE]`, which the gateway takes
    for whole all the same."""
    seen = EndSeen(monkeypatch)
    raw = start_raw(writes(*chunked(EVENT, *[BIG] * EVENTS, done)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    sock, head = stalled_chat(gateway.server.port, gateway.key, json.dumps(CHAT).encode())
    try:
        assert head.startswith(b"HTTP/1.1 200"), head
        if later == "pipelined":
            sock.sendall(_chat(gateway.key))
        assert seen.handed.wait(60), "the gateway never ended the stream"
        assert seen.unsent[0] > 0, "the kernel took the stream's end: no write buffer to test"
        if later == "keep-alive":
            sock.sendall(_chat(gateway.key))
        if later is not None:  # the later request dispatched, answered behind the first
            until(lambda: len(raw.posts) == 2, "the later request dispatched", timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()  # a reset (linger 0): what the write buffer held is dropped
    until(lambda: not gateway.app.serving, "the requests ended", timeout=30)
    request_id = request_id_of(head)
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["type"], last["status"]) == ("completion", 499), (
        f"the client got none of the stream's last {seen.unsent[0]} bytes; the log says {last}"
    )

    def all_settled() -> bool:  # the later request's records too
        kinds = [r["type"] for r in records(tmp_path / "log")]
        return kinds.count("dispatch") == kinds.count("completion")

    until(all_settled, "every dispatch completed in a checkpoint", timeout=30)
    code, printed = run_audit_output(["verify", str(tmp_path / "log"), "--key", vkey])
    assert code == 0, printed


def _read_answer(sock: socket.socket, got: bytes) -> bytes:
    """Read from `sock` (after `got`) until the chunked answer that `got` begins has ended
    (its last, empty chunk): its bytes; what came after it stays unread in the socket, but
    for what the last read carried."""
    data = bytearray(got)
    while True:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            at = head_end + 4
            while True:  # walk the chunks read so far
                size_end = data.find(b"\r\n", at)
                if size_end < 0:
                    break
                size = int(data[at:size_end], 16)
                if len(data) < size_end + 2 + size + 2:
                    break
                at = size_end + 2 + size + 2
                if size == 0:
                    return bytes(data[:at])
        more = sock.recv(4096)
        assert more, "the connection closed before the first answer ended"
        data += more


def test_a_stream_the_client_took_whole_is_recorded_whole_behind_a_later_unread_answer(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two streams pipelined on one connection; the first one's end goes to the
    connection's write buffer, the second answer's first bytes go in behind it (before
    the client reads: a read now would race them), then the client reads that first
    answer to its last chunk (its `[DONE]` and receipt line too) and reads nothing of the
    second, which backs up in the same write buffer; once the first stream's wait saw its
    end taken (no sleep decides when it looks), the client resets. The first client got
    its stream whole: 200. Before, the first stream's wait for its end to be taken waited
    for the connection's whole write buffer to empty, the second answer's bytes in it too:
    it never saw its end taken while the second answer sat unread (this test's wait for it
    failed), and the reset made the first stream 499, the log saying its client never got
    the end it read (a client could so disown any answer it read: pipeline another
    request, read the first answer whole, reset)."""
    seen = EndSeen(monkeypatch)
    ending = vars(passthrough)["end_stream"]  # `EndSeen`'s, which wraps the module's
    taken = body_writer.BodyWriter.taken
    waiting: list[object] = []  # the writers whose requests waited for their bytes taken
    seen_taken: list[object] = []  # ... and those whose wait saw them taken
    first_writer: list[Any] = []
    connection: list[Any] = []  # the connection's transport (its write buffer)

    async def counting(send: Any, exchange: Any, **kwargs: Any) -> None:
        async def sending(message: Any) -> None:
            await send(message)
            if not message.get("more_body"):
                first_writer.append(exchange.writer)
                transport = exchange.writer.cycle_ref().transport
                connection.append(getattr(transport, "_transport", transport))

        await ending(sending, exchange, **kwargs)

    async def awaited(writer: Any) -> bool:
        waiting.append(writer)
        if got := await taken(writer):
            seen_taken.append(writer)
        return got

    monkeypatch.setattr(passthrough, "end_stream", counting)
    monkeypatch.setattr(body_writer.BodyWriter, "taken", awaited)
    raw = start_raw(writes(*chunked(EVENT, *[BIG] * EVENTS, DONE)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    sock, head = stalled_chat(gateway.server.port, gateway.key, json.dumps(CHAT).encode())
    try:
        assert head.startswith(b"HTTP/1.1 200"), head
        sock.sendall(_chat(gateway.key))  # pipelined: answered once the first one ended
        assert seen.handed.wait(60), "the gateway never ended the first stream"
        assert seen.unsent[0] > 0, "the kernel took the stream's end: no write buffer to test"
        # The second request's answer in the write buffer behind the first one's tail,
        # or (now) the second request waiting to answer until that tail is taken.
        until(
            lambda: (
                first_writer[0].unsent > seen.unsent[0]
                or any(w is not first_writer[0] for w in waiting)
            ),
            "the second request answering or waiting",
            timeout=30,
        )
        first = _read_answer(sock, head)  # all of it: the client has the whole stream
        assert DONE in first and first.endswith(b"\r\n0\r\n\r\n"), first[-300:]
        until(  # the second request answering, into the buffer the client no longer reads
            lambda: len(raw.posts) == 2 and connection[0].get_write_buffer_size() > 0,
            "the second answer backed up",
            timeout=30,
        )
        until(
            lambda: first_writer[0] in seen_taken,
            "the first stream's end seen taken, the second answer unread behind it",
            timeout=30,
        )
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()  # a reset: what the write buffer held (the second answer's) is dropped
    until(lambda: not gateway.app.serving, "the requests ended", timeout=30)
    request_id = request_id_of(head)
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["type"], last["status"]) == ("completion", 200), (
        f"the client read the first stream whole, to its last chunk; the log says {last}"
    )


def test_a_stream_taken_whole_before_the_gateway_closes_the_connection_is_recorded_whole(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that asked for `connection: close` (as urllib does) stops reading near the
    stream's end, then reads it all: the gateway's close of the connection, asked for
    once the stream ended, completes once the kernel took the last byte of its write
    buffer, and uvloop then reports the connection lost (no error) in the same callback.
    The client got the whole stream: 200. Before, the stream's wait for its end to be
    taken only ever looked again after that loss: 499, the log saying the client never
    got the end it read."""
    seen = EndSeen(monkeypatch)
    raw = start_raw(writes(*chunked(EVENT, *[BIG] * EVENTS, DONE)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", gateway.server.port))
        sock.settimeout(60)
        sock.sendall(_chat(gateway.key, b"connection: close\r\n"))
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert seen.handed.wait(60), "the gateway never ended the stream"
        assert seen.unsent[0] > 0, "the kernel took the stream's end: no write buffer to test"
        got = _read_answer(sock, head)  # all of it, then the gateway's close
        assert DONE in got and got.endswith(b"\r\n0\r\n\r\n"), got[-300:]
        assert sock.recv(4096) == b"", "the gateway did not close the connection"
    finally:
        sock.close()
    until(lambda: not gateway.app.serving, "the requests ended", timeout=30)
    request_id = request_id_of(head)
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["type"], last["status"]) == ("completion", 200), last
