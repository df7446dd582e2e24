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


def _chat(key: str) -> bytes:
    body = json.dumps(CHAT).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (key.encode(), len(body), body)
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
