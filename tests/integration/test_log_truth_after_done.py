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
