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
- A `[DONE]` still in the gateway's own write buffer (its client stopped reading, the
  socket buffers full) counted as read when the client then left: 200 for an end the
  kernel never took. Only what left the gateway's userspace buffer counts now: 499.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from openai._streaming import SSEDecoder

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
