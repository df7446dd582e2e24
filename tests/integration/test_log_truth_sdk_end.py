"""The stream's end the record states is the end the client's SDK read, off the wire.

Three ways the signed log said more than the client got (each checked here against the
OpenAI SDK's own `SSEDecoder` reading the bytes the client's connection delivered):

- A backend whose body ends with its connection wrote `data: [DONE]` as a line but not
  as an event the SDK stops at: after another `data` line of the same event (`data: {..}`
  then `data: [DONE]` with no blank line between: one event, its data `{..}` and
  `[DONE]` joined, which the SDK's `json.loads` refuses). The gateway took the line for
  the stream's end and recorded 200; the SDK raised. It is now the close before the end
  (502, with the gateway's error event), as for a stream with no `[DONE]` at all.
- A client that closes once the backend's error event reached it (its SDK raised it and
  reads no further) was recorded 499, where a stream that ended after that event is
  recorded 200 with `stream_error: "backend"`: both now say the latter.
- A client that stays to the end of a stream whose backend sent its error event and then
  closed (no framing, no `[DONE]`) or hung past the read timeout was recorded 502 / 504,
  the gateway's error event after the backend's, which the SDK never reads (it raised at
  the backend's): the client saw what one that left there saw, recorded 200 with
  `stream_error: "backend"`. Both now say the latter: what the SDK stopped at.
- A `[DONE]` still in the gateway's own write buffer (its client stopped reading, the
  socket buffers full) counted as read when the client then left: 200 for an end the
  kernel never took. Only what left the gateway's userspace buffer counts now: 499.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openai._streaming import SSEDecoder

from gateway.body_writer import BodyWriter
from gateway.upstream.response import UpstreamResponse
from tests.helpers.audit_rig import (
    assert_logged_as_received,
    chunked,
    client_gets,
    logged,
    request_log,
    settled,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.raw_socket import request_id_of, stalled_chat
from tests.helpers.waiting import until

CHUNK = b'{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}'
ERROR = b'data: {"error":{"message":"down","type":"x"}}\n\n'


def _sdk_end(body: bytes) -> str:
    """Where the OpenAI SDK's legacy `Stream` stops reading `body`: `done` (an event whose
    data starts `[DONE]`), `error` (an event with a truthy `error`: it raises it),
    `raised` (data `json.loads` refuses, a line that is not UTF-8), `end` (none of them)."""
    events = SSEDecoder().iter_bytes(iter([body]))
    while True:
        try:
            sse = next(events)
        except StopIteration:
            return "end"
        except UnicodeDecodeError:
            return "raised"
        if sse.data.startswith("[DONE]"):
            return "done"
        try:
            doc = sse.json()
        except ValueError:
            return "raised"
        if isinstance(doc, dict) and doc.get("error"):
            return "error"


# Unframed bodies (the close ends them): the backend's bytes after its first event.
UNFRAMED: dict[str, bytes] = {
    # `[DONE]` on the line after the last chunk's, no blank line between: one event
    "done-line-joined": b"data: " + CHUNK + b"\ndata: [DONE]\n\n",
    "done-line-joined-unended": b"data: " + CHUNK + b"\ndata: [DONE]",
    "done-line-joined-crlf": b"data: " + CHUNK + b"\r\ndata: [DONE]\r\n\r\n",
    # an event of its own, its blank line missing: the gateway's own bytes end it
    "done-unended": b"data: [DONE]",
    "done-line-ended": b"data: [DONE]\n",
    "done-event": DONE,
}


@pytest.mark.parametrize("case", list(UNFRAMED))
def test_an_unframed_stream_is_recorded_ended_only_at_a_done_event_the_sdk_reads(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    raw = start_raw(writes(sse_head(), EVENT, UNFRAMED[case]))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, CHAT)
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    # What the client's SDK read of the backend's bytes (the gateway's after them end its
    # last event: its receipt line, or its error event after a blank line).
    read = _sdk_end(received.body)
    if case.startswith("done-line-joined"):
        assert b"upstream_error" in received.body, received.body
        assert (last["status"], last["error"]) == (502, "upstream_error"), last
    else:
        assert read == "done", received.body
        assert (last["status"], last["error"]) == (200, None), last
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)


def _hangs_after(pieces: tuple[bytes, ...], release: threading.Event) -> Answer:
    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        return False

    return answer


@pytest.mark.parametrize("framing", ["unframed", "chunked"])
def test_a_client_closing_at_the_backends_error_event_is_recorded_as_its_end_would_be(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    framing: str,
) -> None:
    """The SDK raises the backend's error event and its client closes: the record says
    what a stream that ended there says (200, `stream_error: "backend"`), not 499."""
    unframed = (sse_head(), EVENT, ERROR)
    pieces = chunked(EVENT, ERROR, last=False) if framing == "chunked" else unframed
    release = threading.Event()
    raw = start_raw(_hangs_after(pieces, release))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    try:
        received = client_gets(gateway, CHAT, enough=lambda got: _sdk_end(got) == "error")
        request_id = received.headers["x-request-id"]
        settled(tmp_path / "log", vkey, request_id)
    finally:
        release.set()
    assert _sdk_end(received.body) == "error" and b"owngate-receipt" not in received.body
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["status"], last["error"], last.get("stream_error")) == (200, None, "backend")
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey, left=True)


# The backend's error event, then its end without `[DONE]` (`how`): the connection's close
# (no framing; the event with or without its blank line, the gateway's bytes end it), a
# hang past the read timeout, chunked or not.
AFTER_ERROR: dict[str, tuple[tuple[bytes, ...], str]] = {
    "unframed-close": ((sse_head(), EVENT, ERROR), "close"),
    "unframed-close-unended": ((sse_head(), EVENT, ERROR[:-2]), "close"),
    "unframed-close-crlf": ((sse_head(), EVENT, ERROR.replace(b"\n", b"\r\n")), "close"),
    "unframed-hang": ((sse_head(), EVENT, ERROR), "hang"),
    "chunked-hang": (chunked(EVENT, ERROR, last=False), "hang"),
}


@pytest.mark.parametrize("case", list(AFTER_ERROR))
def test_a_client_staying_after_the_backends_error_event_is_recorded_as_one_leaving_there(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """The SDK raises at the backend's error event and reads nothing after it, whether
    its client then closes or stays: the record says the same for both (200,
    `stream_error: "backend"`), and the gateway writes no error event of its own after
    it. Before, a client that stayed was recorded 502 (or 504) for a close (or a hang)
    it never saw."""
    pieces, how = AFTER_ERROR[case]
    release = threading.Event()
    raw = start_raw(writes(*pieces) if how == "close" else _hangs_after(pieces, release))
    gateway, vkey = logged(
        start_gateway, tmp_path, [backend("gpu", raw.url, "m")], limits={"read_timeout_s": 1}
    )
    try:
        received = client_gets(gateway, CHAT)
    finally:
        release.set()
    assert _sdk_end(received.body) == "error", received.body
    assert b"upstream_" not in received.body, received.body[-300:]
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["status"], last["error"], last.get("stream_error")) == (200, None, "backend")
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)


# Events enough to fill the kernel's buffers towards a client that reads nothing (a small
# receive buffer): the rest, `[DONE]` with it, stays in the gateway's write buffer.
BIG = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % (b"x" * 8000)
FLOOD = 1000  # events of BIG: some 8 MB


def test_a_done_left_in_the_gateways_write_buffer_is_not_read_by_a_client_that_resets(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client stops reading, the gateway writes the backend's events and `[DONE]` to
    its connection (the flow control bent so that it writes on: the write buffer holds
    them), and the client resets: `[DONE]` never left the gateway's process, so the
    client did not read the answer whole. Before, 200."""
    written = threading.Event()
    buffered: list[int] = []
    cycles: list[Any] = []  # the response's, once the relay's sink writes to it
    ready, pump = BodyWriter.ready, UpstreamResponse.pump

    def readied(self: BodyWriter) -> bool:
        is_ready = ready(self)
        cycle = self.cycle_ref()
        if is_ready and cycle is not None:  # write on past the high-water mark
            cycle.transport.set_write_buffer_limits(high=1 << 30)
            cycles.append(cycle)
        return is_ready

    async def pumping(self: UpstreamResponse, sink: Callable[[bytes], bool], *args: Any) -> None:
        def noting(data: bytes) -> bool:  # the relay's sink, which writes each read
            more = sink(data)
            if data.find(b"[DONE]") >= 0 and cycles:
                buffered.append(cycles[0].transport.get_write_buffer_size())
                written.set()
            return more

        await pump(self, noting, *args)

    monkeypatch.setattr(BodyWriter, "ready", readied)
    monkeypatch.setattr(UpstreamResponse, "pump", pumping)
    release = threading.Event()
    pieces = chunked(EVENT, *[BIG] * FLOOD, DONE, last=False)
    raw = start_raw(_hangs_after(pieces, release))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    sock, head = stalled_chat(gateway.server.port, gateway.key, json.dumps(CHAT).encode())
    try:
        assert head.startswith(b"HTTP/1.1 200"), head
        assert written.wait(60), "the gateway never wrote [DONE]"
        assert buffered[0] > 0, "the kernel took [DONE]: no write buffer to test"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()  # a reset (linger 0): what the write buffer held is dropped
        release.set()
    request_id = request_id_of(head)
    until(lambda: not gateway.app.serving, "the request ended", timeout=30)
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert last["status"] == 499, last
