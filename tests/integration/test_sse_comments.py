"""A private backend cannot put an `owngate-` comment line in front of a client.

The gateway ends each stream it relays with its own `: owngate-receipt <base64>` line. A
hostile backend that writes such lines earlier (another request's genuine receipt, a
forged countersignature, a comment too long to hold) gets them removed: the client sees
exactly one, the gateway's, and the log commits to exactly the bytes the client got.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.provenance import load_signer
from tests.helpers.attest import start_sidecar
from tests.helpers.gateways import Gateway, backend, logged_gateway, logged_private_gateway
from tests.helpers.provenance import completion_record, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.stream_receipts import (
    CHAT,
    DONE,
    owngate_lines,
    receipt_verifies,
    stream_receipt,
)

ORIGIN = "test.owngate/sse-comments"
EVENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def _ask(gateway: Gateway, status: int = 200) -> httpx.Response:
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == status, response.text
    return response


def test_injected_owngate_comments_never_reach_the_client(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    genuine: list[bytes] = []  # a receipt the gateway gave an earlier request

    async def hostile(writer: asyncio.StreamWriter, _: Post) -> bool:
        body = EVENT
        if genuine:
            body += b": owngate-receipt " + base64.b64encode(genuine[0]) + b"\n\n"
            body += b":owngate-attest Y\r\n"
            body += b"data: {}\r: owngate-receipt CR\r\r"
            body += b": ping\n\n"
            body += b":\towngate-anything else\n"
        writer.write(sse_head() + body + DONE)
        await writer.drain()
        return False

    raw = start_raw(hostile)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    first = _ask(gateway)
    genuine.append(stream_receipt(first))
    second = _ask(gateway)

    receipt = stream_receipt(second)  # exactly one: the gateway's, not the injected one
    assert receipt != genuine[0]
    assert b": ping\n\n" in second.content  # an ordinary comment passes untouched
    assert b"data: {}\r\r" in second.content
    assert second.content.startswith(EVENT)
    receipt_verifies(tmp_path, second, receipt, second.content.split(b": owngate-receipt ")[0])
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert 'owngate_sse_comments_stripped_total{backend="gpu"} 4.0' in metrics
    said = [line for line in capsys.readouterr().out.splitlines() if "comment lines" in line]
    assert len(said) == 1 and "backend=gpu" in said[0] and "lines=4" in said[0]
    assert "owngate-" not in said[0] and base64.b64encode(genuine[0]).decode() not in said[0]


def test_a_megabyte_comment_without_end_is_dropped_and_the_stream_ends_cleanly(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    async def endless_comment(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + EVENT + b": owngate-receipt ")
        for _ in range(256):  # 1 MiB of it, no line end, then the backend hangs up
            writer.write(b"A" * 4096)
            await writer.drain()
        return False

    raw = start_raw(endless_comment)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = _ask(gateway)
    assert len(response.content) < 4096  # none of it relayed
    assert response.content.startswith(EVENT)
    receipt = stream_receipt(response)
    # The close before `[DONE]` is the backend dying: an error event, recorded as failed.
    error = response.content.split(b": owngate-receipt ")[0][len(EVENT) :]
    assert error.startswith(b"data: {") and b'"upstream_error"' in error
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 502
    receipt_verifies(tmp_path, response, receipt, EVENT)


def test_the_receipt_starts_its_own_line_after_a_stream_that_ends_mid_line(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """A backend's last line without its line end would swallow the receipt line (the
    client would find none): the gateway starts a line first."""

    async def unended(writer: asyncio.StreamWriter, _: Post) -> bool:
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        body = EVENT + b"data: [DONE]"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        await writer.drain()
        return False

    raw = start_raw(unended)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = _ask(gateway)
    assert b"data: [DONE]\n: owngate-receipt " in response.content
    receipt_verifies(tmp_path, response, stream_receipt(response), EVENT + b"data: [DONE]")


def test_an_inference_server_behind_a_sidecar_cannot_forge_lines_or_cut_the_stream(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """An attested backend's inference server writes a forged `: owngate-attest` and a
    receipt line mid-stream: the client gets neither, nor a stream cut at the forged
    countersignature (the gateway used to keep everything after it as the sidecar's
    tail). The sidecar removes them too before it hashes what it relays, so it signs
    what the client gets: its countersignature is accepted (before, it signed the
    server's bytes, and every such answer was a `mismatch`), and both logs agree."""

    async def hostile(writer: asyncio.StreamWriter, _post: Post) -> bool:
        body = EVENT + b": owngate-attest Rk9SR0VE\n\n" + b": owngate-receipt X\n\n"
        body += EVENT + DONE
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        await writer.drain()
        return False

    raw = start_raw(hostile)
    sidecar = start_sidecar(tmp_path / "sidecar", "gpu-a", raw.url)
    try:
        attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
        response = _ask(gateway)
    finally:
        sidecar.stop()
    receipt = stream_receipt(response)
    relayed = EVENT + b"\n\n" + EVENT + DONE  # the blank lines after the removed ones
    assert response.content.split(b": owngate-receipt ")[0] == relayed
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["attestation"]["failure"] is None and record["attestation"]["sig"]
    receipt_verifies(tmp_path, response, receipt, relayed)


def test_a_countersignature_the_inference_server_writes_as_its_last_line_is_not_taken(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The inference server behind a sidecar ends its stream with a `: owngate-attest`
    line of its own: a genuine countersignature of the sidecar's key, the one it signed
    for the request before (the server sees neither request ids nor salts, so a replayed
    statement is the most it can offer). The sidecar removes the line before it hashes
    and signs its own, so the client's stream, the record, the receipt and the sidecar's
    log carry the sidecar's statement for this request, and both audits pass."""
    stream = EVENT + DONE
    injected: list[bytes] = []  # the line the server ends its streams with, once known

    async def injecting(writer: asyncio.StreamWriter, _post: Post) -> bool:
        body = stream + b"".join(injected)
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        await writer.drain()
        return False

    raw = start_raw(injecting)
    sidecar = start_sidecar(tmp_path / "sidecar", "gpu-a", raw.url)
    try:
        attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
        first = json.loads(stream_receipt(_ask(gateway)))["attestation"]
        injected.append(b": owngate-attest " + base64.b64encode(json.dumps(first).encode()))
        injected.append(b"\n\n")
        response = _ask(gateway)
    finally:
        assert sidecar.stop() == 0
    relayed = stream + b"\n"  # the blank line after the removed one
    assert response.content.split(b": owngate-receipt ")[0] == relayed
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["attestation"]["failure"] is None
    assert record["attestation"]["counter"] == 1  # the sidecar's second, not the replayed 0
    receipt = stream_receipt(response)
    assert json.loads(receipt)["attestation"] != first
    receipt_verifies(tmp_path, response, receipt, relayed)
    log_key = load_signer(tmp_path / "log.key").vkey
    audit = ["verify", str(tmp_path / "log"), "--key", log_key]
    audit += ["--backend-key", f"gpu={sidecar.vkey}", "--attest-log", f"gpu={sidecar.log}"]
    assert run_audit(audit) == 0


@pytest.mark.parametrize(
    "content_type",
    [b"Text/Event-Stream", b"application/json"],
    ids=["sse-in-capitals", "not-sse"],
)
def test_a_stream_answered_under_another_content_type_carries_no_owngate_line(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    content_type: bytes,
) -> None:
    """An SSE client reads a stream request's answer as SSE whatever its content type
    says (the OpenAI SDK does, and `Text/Event-Stream` is SSE): a backend cannot slip its
    lines past the relay by naming the type differently. Answered as `application/json`,
    the stream request's answer is of the wrong shape: a 502 the client gets instead,
    none of the backend's bytes (tests/integration/test_answer_shapes.py)."""
    body = EVENT + b": owngate-receipt X\n\n" + DONE

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % (content_type, len(body)) + body)
        await writer.drain()
        return False

    raw = start_raw(answer)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    response = _ask(gateway, 502 if content_type == b"application/json" else 200)
    if content_type == b"application/json":
        assert response.json()["error"]["code"] == "upstream_error"
        assert owngate_lines(response.content) == []
        return
    relayed = EVENT + b"\n" + DONE
    receipt = stream_receipt(response)
    receipt_verifies(tmp_path, response, receipt, relayed)
