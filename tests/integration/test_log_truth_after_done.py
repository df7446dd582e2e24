"""A stream whose backend fails after its `data: [DONE]` went out: the client saw a
complete answer, and the record says so.

The OpenAI SDKs stop reading a stream at the event whose data starts `[DONE]`
(openai/_streaming.py), and so does the record's usage (docs/provenance.md). A backend
that then hangs (past `limits.read_timeout_s`), breaks its chunked framing or resets the
connection used to have its stream ended with the gateway's error event, after the
`[DONE]` the client had read, and recorded as `504 upstream_timeout` / `502
upstream_error`: the signed log said an answer failed that every SDK client read whole.
Now the failure after `[DONE]` ends the stream as the backend's end would (its receipt
line, no error event) and the record says 200; its response commitment still opens with
every byte the client got. The record is checked by the independent auditor
(tests/helpers/independent_audit.py, written from the docs alone).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from openai._streaming import SSEDecoder

from tests.helpers.audit_rig import (
    USAGE_CHUNK,
    chunked,
    client_gets,
    logged,
    request_log,
    settled,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.independent_audit import audit
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

# What the backend writes, then how it fails: `hang` holds the connection open (the
# gateway's read timeout ends the read), `close` closes it with its chunked body unended,
# `reset` resets it.
CASES: dict[str, tuple[tuple[bytes, ...], str]] = {
    "chunked-hang": (chunked(EVENT, USAGE_CHUNK, DONE, last=False), "hang"),
    "unframed-hang": ((sse_head(), EVENT, USAGE_CHUNK, DONE), "hang"),
    "chunked-close": (chunked(EVENT, USAGE_CHUNK, DONE, last=False), "close"),
    "chunked-reset": (chunked(EVENT, USAGE_CHUNK, DONE, last=False), "reset"),
    "chunked-more-then-hang": (chunked(EVENT, DONE, EVENT, last=False), "hang"),
    # the marker as an SSE parser reads it: cut across the backend's writes, after CRs,
    # without its space, named, or left without its blank line (the receipt line's ends it)
    "split-marker-hang": (chunked(EVENT + b"data: [DO", b"NE]\n\n", last=False), "hang"),
    "cr-lines-hang": (
        chunked(EVENT.replace(b"\n", b"\r"), b"data: [DONE]\r\r", last=False),
        "hang",
    ),
    "no-space-hang": (chunked(EVENT, b"data:[DONE]\n\n", last=False), "hang"),
    "named-hang": (chunked(EVENT, b"event: end\ndata: [DONE]\n\n", last=False), "hang"),
    "unended-hang": (chunked(EVENT, b"data: [DONE]\n", last=False), "hang"),
}

# A `data: [DONE]` line that is not the first data line of its event: the SDK joins the
# event's data lines and its JSON read of `{...}\n[DONE]` raises; no SDK stops there, so
# a failure after it is the stream's failure (an error event, a 504 record), as it is
# without the line. (The relay used to take any `data: [DONE]` line for the end and
# record 200 for a stream the backend broke off.)
NO_END: dict[str, tuple[bytes, ...]] = {
    "second-data-line": chunked(EVENT[:-1] + DONE, last=False),
    "after-usage-in-its-event": chunked(EVENT, USAGE_CHUNK[:-1] + DONE, last=False),
    "after-a-long-line": chunked(
        EVENT, b'data: {"x":"' + b"a" * 70_000 + b'"}\n' + DONE, last=False
    ),
}


def _fails_after(pieces: tuple[bytes, ...], how: str, release: threading.Event) -> Answer:
    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        if how == "hang":  # until the test has its answer (60 s at most)
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        elif how == "reset":
            writer.transport.abort()
        return False

    return answer


def _sdk_reads(body: bytes) -> tuple[int, bool]:
    """How many events the OpenAI SDK's decoder reads before it stops, and whether it
    stopped at `[DONE]` (not at an error event or the stream's end)."""
    read = 0
    for event in SSEDecoder().iter_bytes(iter([body])):
        if event.data.startswith("[DONE]"):
            return read, True
        if '"error"' in event.data:
            return read, False
        read += 1
    return read, False


@pytest.mark.parametrize("case", list(CASES))
def test_a_backend_failing_after_done_leaves_the_answer_the_client_read_complete(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    pieces, how = CASES[case]
    release = threading.Event()
    raw = start_raw(_fails_after(pieces, how, release))
    gateway, vkey = logged(
        start_gateway,
        tmp_path,
        [backend("gpu", raw.url, "m")],
        limits={"read_timeout_s": 1},
    )
    try:
        received = client_gets(gateway, {**CHAT, "stream_options": {"include_usage": True}})
    finally:
        release.set()
    assert received.status == 200, received.body
    assert _sdk_reads(received.body)[1], received.body  # the SDK read up to [DONE]
    assert b'"error"' not in received.body, received.body
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["type"], last["status"], last["error"]) == ("completion", 200, None), last
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8} or (
        USAGE_CHUNK not in pieces and last["usage"] is None
    ), last
    assert audit(received, tmp_path / "log", vkey) == []


@pytest.mark.parametrize("asks_usage", [True, False])
@pytest.mark.parametrize("case", list(NO_END))
def test_a_done_line_inside_an_event_is_no_end_to_fail_after(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
    asks_usage: bool,
) -> None:
    release = threading.Event()
    raw = start_raw(_fails_after(NO_END[case], "hang", release))
    gateway, vkey = logged(
        start_gateway,
        tmp_path,
        [backend("gpu", raw.url, "m")],
        limits={"read_timeout_s": 1},
    )
    ask = {**CHAT, "stream_options": {"include_usage": True}} if asks_usage else CHAT
    try:
        received = client_gets(gateway, ask)
    finally:
        release.set()
    assert received.status == 200, received.body
    assert not _sdk_reads(received.body)[1], received.body  # the SDK never read [DONE]
    assert b'"code":"upstream_timeout"' in received.body, received.body[-300:]
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    last = request_log(tmp_path / "log", vkey, request_id)[-1]
    assert (last["type"], last["status"]) == ("completion", 504), last
    assert audit(received, tmp_path / "log", vkey) == []
