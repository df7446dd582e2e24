"""A client that leaves once it read `data: [DONE]`: it had the whole answer, and the
record says so.

The OpenAI SDKs stop reading a stream at the event whose data starts `[DONE]`, and the
sync Python SDK then closes the response (openai/_streaming.py, `Stream.__stream__`'s
`finally`), so its connection goes before the gateway's receipt line when the backend
has not ended its body yet (no last chunk, or it hangs) or the gateway is still readying
the end (the receipt being signed, the tenant's charge). The gateway then saw a client
leave and recorded 499 "client closed the request" for an answer its client read whole:
the signed log said the client did not get what it got. Now a client that leaves once
the `[DONE]` event (as its SDK reads it, and everything before it) went to its
connection is recorded with the stream's status (200), its usage, and a response
commitment to exactly the bytes sent; one that leaves before it is still 499. The
records are checked by the independent auditor (tests/helpers/independent_audit.py,
written from the docs alone: a client that `left` got 499 unless it read `[DONE]`).
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

import openai
import pytest
from openai._streaming import SSEDecoder

from gateway.api.exchange import send_relayed
from gateway.api.trail import Trail
from tests.helpers.audit_rig import (
    HOSTED_ASK,
    HOSTED_END,
    HOSTED_EVENT,
    HOSTED_USAGE,
    USAGE_CHUNK,
    assert_logged_as_received,
    chunked,
    client_gets,
    hosted_gateway,
    logged,
    openai_chunk,
    request_log,
    settled,
    writes,
)
from tests.helpers.gateways import LITELLM_WARNINGS, Gateway, backend
from tests.helpers.hold import Hold
from tests.helpers.hooked_gateway import lost_seen
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.raw_socket import request_id_of, stalled_chat
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS  # the hosted case: a client that left a hosted stream

COUNTS = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
ASKS_USAGE = {**CHAT, "stream_options": {"include_usage": True}}

# What the backend writes before it hangs (its body never ended), and whether the client's
# SDK reads a `[DONE]` event in it: it then has the whole answer.
CASES: dict[str, tuple[tuple[bytes, ...], bool]] = {
    "chunked": (chunked(EVENT, USAGE_CHUNK, DONE, last=False), True),
    "unframed": ((sse_head(), EVENT, USAGE_CHUNK, DONE), True),
    "done-with-the-last-event": ((sse_head(), EVENT, USAGE_CHUNK + DONE), True),
    # The SDK stops before `[DONE]`: its client did not get the answer whole.
    "left-before-done": ((sse_head(), EVENT, USAGE_CHUNK), False),
    # A `data: [DONE]` line inside an event the SDK raises at (its data is `x` and
    # `[DONE]` joined, not JSON): it never reads a `[DONE]` event.
    "done-inside-an-event": ((sse_head(), EVENT, b"data: x\ndata: [DONE]\n\n"), False),
    # The backend's error event first: the SDK raises there, never reads the `[DONE]`;
    # its client had the stream's end as its SDK reads it, the record says so (200 and
    # `stream_error`, as a stream ending there; before, 499:
    # tests/integration/test_log_truth_sdk_end.py)
    "error-event-first": (
        (sse_head(), EVENT, b'data: {"error":{"message":"down"}}\n\n' + DONE),
        False,
    ),
}


def _hangs_after(pieces: tuple[bytes, ...], release: threading.Event) -> Answer:
    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        # the body never ends (until the test has its answer; 60 s at most)
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        return False

    return answer


def _sdk_stopped(body: bytes) -> bool:
    """Whether the OpenAI SDK's decoder, reading `body`, has come to where its client
    stops reading: an event whose data starts `[DONE]`, an error event, or data it
    cannot parse (it raises). The SDK-like client closes its connection there."""
    for event in SSEDecoder().iter_bytes(iter([body])):
        if event.data.startswith("[DONE]") or '"error"' in event.data:
            return True
        if not event.data.startswith("{"):
            return True
    return False


@pytest.mark.parametrize("case", list(CASES))
def test_a_client_closing_at_done_got_the_whole_answer_and_the_record_says_so(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    pieces, whole = CASES[case]
    release = threading.Event()
    raw = start_raw(_hangs_after(pieces, release))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    try:  # reads as the SDK does, and closes where it stops (or, before, once it has
        # what the backend wrote)
        received = client_gets(
            gateway, ASKS_USAGE, enough=lambda got: _sdk_stopped(got) or got.endswith(pieces[-1])
        )
        request_id = received.headers["x-request-id"]
        settled(tmp_path / "log", vkey, request_id)
    finally:
        release.set()
    assert received.status == 200 and b"owngate-receipt" not in received.body
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    if whole:
        assert (last["status"], last["error"]) == (200, None), last
        assert last["usage"] == COUNTS, last
    elif case == "error-event-first":
        assert (last["status"], last["error"], last.get("stream_error")) == (200, None, "backend")
    else:
        assert last["status"] == 499, last
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey, left=True)


def test_the_openai_sdk_reading_a_stream_whose_backend_hangs_after_done_is_recorded_200(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The real sync SDK: it reads the events, stops at `[DONE]` and closes the response
    while the backend still holds its body open."""
    release = threading.Event()
    raw = start_raw(_hangs_after(CASES["chunked"][0], release))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    sdk = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0)
    try:
        with sdk.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
            timeout=30,
        ) as stream:
            chunks = list(stream)  # up to `[DONE]`; the SDK closes the response then
            request_id = stream.response.headers["x-request-id"]
        settled(tmp_path / "log", vkey, request_id)
    finally:
        release.set()
        sdk.close()
    assert chunks and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == COUNTS["total_tokens"]
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["type"], last["status"], last["error"]) == ("completion", 200, None), last
    assert last["usage"] == COUNTS, last


def test_a_client_closing_at_a_hosted_streams_done_while_its_end_is_readied_is_recorded_200(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hosted stream (the gateway writes its `[DONE]` itself, after the provider's
    finish): the client closes at it while the gateway still signs the receipt its end
    would carry. It had the whole answer: 200, committed to every byte it got."""
    seen = lost_seen(monkeypatch)
    hold = Hold(monkeypatch, Trail, "sealed_receipt")
    raw = start_raw(writes(*chunked(HOSTED_EVENT, HOSTED_END, HOSTED_USAGE, DONE)))
    gateway, vkey = hosted_gateway(start_gateway, tmp_path, raw.url)
    try:
        received = client_gets(gateway, HOSTED_ASK, enough=_sdk_stopped)
        assert hold.entered.wait(30), "the gateway never readied the stream's end"
        assert seen.wait(30), "the gateway did not see the client go"
    finally:
        hold.released.set()
    until(lambda: not gateway.app.serving, "the request ended", timeout=30)
    assert received.body.endswith(DONE), received.body
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["status"], last["error"]) == (200, None), last
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey, left=True)


def test_a_stream_the_drain_deadline_cuts_after_its_done_ends_as_its_end_would(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The gateway's own cut (its drain deadline) lands after `[DONE]` went out, the
    backend still holding its body open: the client read the answer whole, so the stream
    ends with its receipt line and no error event after `[DONE]` (which no SDK reads), and
    the record says 200 (before: a 503 `not_ready` event after `[DONE]`, recorded 503)."""
    release = threading.Event()
    raw = start_raw(_hangs_after(CASES["chunked"][0], release))
    gateway, vkey = logged(
        start_gateway,
        tmp_path,
        [backend("gpu", raw.url, "m")],
        limits={"drain_timeout_s": 0.001},
    )

    drained = threading.Event()

    def cut_at_done(got: bytes) -> bool:
        if _sdk_stopped(got) and not drained.is_set():
            drained.set()
            (task,) = list(gateway.app.serving)  # the request: its loop is the server's
            task.get_loop().call_soon_threadsafe(gateway.app.begin_drain)
        return False  # read on, to the end the gateway writes

    try:
        received = client_gets(gateway, ASKS_USAGE, enough=cut_at_done)
    finally:
        release.set()
    assert received.status == 200 and b'"error"' not in received.body, received.body
    assert b": owngate-receipt " in received.body, received.body
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["status"], last["error"]) == (200, None), last
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)


def test_a_hosted_streams_done_left_in_the_write_buffer_is_not_read_by_a_client_that_resets(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hosted stream's `[DONE]` (the gateway's own) handed to the connection of a
    client that stopped reading stays in the gateway's write buffer (the flow control
    bent so that it writes on); the client resets while the stream's end is readied: it
    never got `[DONE]`, so it is 499, as for a private stream
    (tests/integration/test_log_truth_sdk_end.py). Before, 200."""
    buffered: list[int] = []  # what the write buffer held once `[DONE]` was handed to it
    bent: list[bool] = []

    async def relaying(send: Any, exchange: Any, data: bytes) -> None:
        if not bent:  # small kernel buffers (a hosted answer's size is bounded), and
            # writes on past the high-water mark
            cycle = exchange.writer.cycle_ref()
            transport = getattr(cycle.transport, "_transport", cycle.transport)
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            transport.set_write_buffer_limits(high=1 << 30)
            bent.append(True)
        await send_relayed(send, exchange, data)
        if data.find(b"[DONE]") >= 0:
            buffered.append(exchange.writer.unsent)

    monkeypatch.setattr("gateway.api.hosted_relay.send_relayed", relaying)
    seen = lost_seen(monkeypatch)
    hold = Hold(monkeypatch, Trail, "sealed_receipt")
    big = openai_chunk(b'[{"index":0,"delta":{"content":"%s"}}]' % (b"x" * 8000))
    raw = start_raw(writes(*chunked(HOSTED_EVENT, *[big] * 40, HOSTED_END, DONE)))
    gateway, vkey = hosted_gateway(start_gateway, tmp_path, raw.url)
    sock, head = stalled_chat(gateway.server.port, gateway.key, json.dumps(HOSTED_ASK).encode())
    try:
        assert head.startswith(b"HTTP/1.1 200"), head
        assert hold.entered.wait(60), "the gateway never readied the stream's end"
        assert buffered and buffered[0] > 0, "the kernel took [DONE]: no write buffer to test"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset (linger 0): what the write buffer held is dropped
        assert seen.wait(30), "the gateway did not see the client go"
    finally:
        sock.close()
        hold.released.set()
    until(lambda: not gateway.app.serving, "the request ended", timeout=30)
    request_id = request_id_of(head)
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert last["status"] == 499, last
