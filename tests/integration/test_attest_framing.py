"""Streams through the `owngate attest` sidecar whose backend frames them in ways uvicorn
never does: lines ended with LF, CRLF or a bare CR (SSE allows all three). The sidecar's
final `: owngate-attest` comment follows whatever ended the backend's last line, and the
gateway must take it as the countersignature in each case (after a bare CR it used to be
relayed to the client and the answer recorded as `missing`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.helpers.attest import start_sidecar
from tests.helpers.gateways import Gateway, backend, logged_gateway
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

ORIGIN = "gw.test/attest-framing"
ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


def _events(ending: bytes) -> bytes:
    return b'data: {"choices":[]}' + ending + ending + b"data: [DONE]" + ending + ending


async def _chunked_stream(writer: asyncio.StreamWriter, post: Post) -> bool:
    """The events with the line end the request's one message names, in one chunk."""
    events = _events(ENDINGS[json.loads(post.body)["messages"][0]["content"]])
    framing = b"transfer-encoding: chunked\r\n"
    writer.write(sse_head(framing) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(events), events))
    await writer.drain()
    return True


def test_the_countersignature_follows_any_sse_line_ending(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    raw = start_raw(_chunked_stream)
    sidecar = start_sidecar(tmp_path, "gpu-a", raw.url)
    try:
        attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
        failures, relayed = {}, {}
        for name in ENDINGS:
            body = {"model": "m", "messages": [{"role": "user", "content": name}], "stream": True}
            response = httpx.post(
                f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=30
            )
            assert response.status_code == 200, response.text
            relayed[name] = response.content.split(b": owngate-receipt ")[0]
            record = completion_record(tmp_path / "log", response.headers["x-request-id"])
            failures[name] = record["attestation"]["failure"]
        assert failures == dict.fromkeys(ENDINGS)
        assert relayed == {name: _events(ending) for name, ending in ENDINGS.items()}
    finally:
        sidecar.process.kill()


async def _unended_stream(writer: asyncio.StreamWriter, post: Post) -> bool:
    """A complete chunked answer whose last line has no line end."""
    events = b'data: {"choices":[]}\n\ndata: [DONE]'
    framing = b"transfer-encoding: chunked\r\n"
    writer.write(sse_head(framing) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(events), events))
    await writer.drain()
    return True


def test_a_stream_ending_mid_line_gets_the_comment_on_a_line_of_its_own(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """Glued to an unended last line, the comment would be that line's text: the client's
    last `data:` would carry the sidecar's signature, and the answer no countersignature."""
    raw = start_raw(_unended_stream)
    sidecar = start_sidecar(tmp_path, "gpu-a", raw.url)
    try:
        attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers, timeout=30
        )
        assert response.status_code == 200, response.text
        assert b"owngate-attest" not in response.content
        assert response.content.startswith(b'data: {"choices":[]}\n\ndata: [DONE]\n: owngate-')
        record = completion_record(tmp_path / "log", response.headers["x-request-id"])
        assert record["attestation"]["failure"] is None
    finally:
        sidecar.process.kill()
