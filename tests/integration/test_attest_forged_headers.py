"""A backend not marked `attest` cannot hand the client a countersignature: the gateway
relays none of a backend's response headers but its content type (a forged
`x-owngate-attest` or `x-owngate-receipt` stays behind), removes a stream's final
`: owngate-attest` comment like any `owngate-` line, and neither the receipt nor the
completion record carries an attestation. The countersignatures here are genuine, signed
by a key, so one that got through would verify with it."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.provenance import Salts, commit, load_signer, verify_receipt
from gateway.provenance.formats.attestation import Statement, sign_statement
from gateway.provenance.testing import CountingRandom, seeded_signer
from tests.helpers.gateways import Gateway, logged_private_gateway
from tests.helpers.provenance import completion_record, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

ORIGIN = "test.owngate/forged-headers"
SIDECAR = seeded_signer("gpu.test/elsewhere")
ANSWER = b'{"id":"c","object":"chat.completion","choices":[]}'
EVENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def _countersignature(request_id: str, body: bytes) -> bytes:
    """A genuine countersignature, base64, by a key the gateway was not given."""
    salts = Salts.generate(CountingRandom("forged"))
    statement = Statement(
        request_id,
        "2026-01-01T00:00:00.000Z",
        1,
        str(SIDECAR),
        commit("request", salts.request, b"{}"),
        commit("response", salts.response, body),
    )
    return base64.b64encode(sign_statement(statement, SIDECAR))


def _checked(tmp_path: Path, response: httpx.Response, receipt: bytes) -> None:
    """The receipt is the gateway's, carries no attestation, and the log records none."""
    key = load_signer(tmp_path / "log.key").verifier()
    assert verify_receipt(receipt, [key]).request_id == response.headers["x-request-id"]
    assert "attestation" not in json.loads(receipt)
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert "attestation" not in record
    path = tmp_path / "receipt.json"
    path.write_bytes(receipt)
    assert run_audit(["receipt", "verify", str(path), "--key", key.vkey]) == 0


def test_a_whole_answers_countersignature_headers_stay_behind(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    async def forging(writer: asyncio.StreamWriter, _post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        head += b"x-owngate-attest: " + _countersignature("req_0", ANSWER) + b"\r\n"
        head += b"x-owngate-receipt: Rk9SR0VE\r\ncontent-length: %d\r\n\r\n" % len(ANSWER)
        writer.write(head + ANSWER)
        await writer.drain()
        return False

    raw = start_raw(forging)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=chat, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200 and response.content == ANSWER
    assert "x-owngate-attest" not in response.headers
    assert response.headers.get_list("x-owngate-receipt") == [response.headers["x-owngate-receipt"]]
    _checked(tmp_path, response, base64.b64decode(response.headers["x-owngate-receipt"]))


def test_a_streams_final_attest_comment_from_a_backend_not_attested_is_removed(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    async def forging(writer: asyncio.StreamWriter, _post: Post) -> bool:
        body = EVENT + DONE + b": owngate-attest " + _countersignature("req_0", EVENT) + b"\n\n"
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        await writer.drain()
        return False

    raw = start_raw(forging)
    gateway = logged_private_gateway(start_gateway, tmp_path, raw.url, ORIGIN)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=chat, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    assert b"owngate-attest" not in response.content
    body, _, line = response.content.partition(b": owngate-receipt ")
    assert body == EVENT + DONE + b"\n" and line.endswith(b"\n\n")  # the blank line stays
    _checked(tmp_path, response, base64.b64decode(line[:-2]))
