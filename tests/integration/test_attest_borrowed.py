"""Issue 15, layer 3, live: a sidecar (or whatever answers at its address) that hands back
a countersignature its key really signed, but for other commitments: one the real
sidecar signed for a request that bypassed the gateway, returned for the gateway's
request, in a whole answer's header and in a stream's final comment. The gateway must
not take it for a two-party statement: the record says `mismatch`, the client's receipt
carries no countersignature, the metric counts it, and `audit verify --backend-key`
fails naming the request.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.provenance import load_signer
from tests.helpers.attest import Sidecar, start_sidecar
from tests.helpers.gateways import ADMIN_HEADERS, Gateway, Sim, backend, logged_gateway
from tests.helpers.provenance import completion_record, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend

ORIGIN = "gw.test/borrowed"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
WHOLE = b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[]}'
STREAM = b'data: {"id":"c","choices":[]}\n\ndata: [DONE]\n\n'


@pytest.fixture
def sidecar(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[Sidecar]:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    started = start_sidecar(tmp_path, "gpu", sim.url)
    yield started
    started.process.kill()


def _borrowing(envelope: bytes) -> Answer:
    """A backend that answers every request with `envelope` as its countersignature."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        if json.loads(post.body).get("stream"):
            body = STREAM + b": owngate-attest " + envelope + b"\n\n"
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        else:
            body = WHOLE
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            head += b"x-owngate-attest: " + envelope + b"\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return False

    return answer


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_countersignature_for_other_commitments_is_not_a_two_party_statement(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    sidecar: Sidecar,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stream: bool,
) -> None:
    direct = httpx.post(f"{sidecar.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert direct.status_code == 200
    envelope = direct.headers["x-owngate-attest"].encode()
    raw = start_raw(_borrowing(envelope))
    attested = backend("gpu", raw.url, "m", attest={"key": sidecar.vkey})
    gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**CHAT, "stream": stream},
        headers=gateway.headers,
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert b"owngate-attest" not in answer.content
    assert "x-owngate-attest" not in answer.headers
    request_id = answer.headers["x-request-id"]
    record = completion_record(tmp_path / "log", request_id)
    assert record["attestation"]["failure"] == "mismatch"
    assert record["attestation"]["sig"] is None
    if stream:
        line = answer.content.split(b": owngate-receipt ")[1].split(b"\n")[0]
        receipt = json.loads(base64.b64decode(line))
    else:
        receipt = json.loads(base64.b64decode(answer.headers["x-owngate-receipt"]))
    assert "attestation" not in receipt
    metrics = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=10).text
    assert 'owngate_attestations_total{backend="gpu",result="mismatch"} 1.0' in metrics

    vkey = load_signer(tmp_path / "log.key").vkey
    capsys.readouterr()
    audit = ["verify", str(tmp_path / "log"), "--key", vkey, "--backend-key", f"gpu={sidecar.vkey}"]
    assert run_audit(audit) == 1
    said = capsys.readouterr().err
    assert f"request {request_id!r} (backend gpu)" in said
    assert "the gateway recorded failure mismatch" in said


@pytest.mark.parametrize("status", [400, 500])
def test_a_countersigned_error_answer_is_no_two_party_statement(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    sidecar: Sidecar,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    status: int,
) -> None:
    # A sidecar that countersigns an error answer (here: a genuine envelope of its key on
    # one) gets it neither recorded nor handed on: the client's error is the gateway's own
    # (docs/provenance.md, layer 3: only answers below 400 are countersigned), so no
    # statement could cover its bytes, and the audit holds the error record to nothing.
    direct = httpx.post(f"{sidecar.url}/v1/chat/completions", json=CHAT, timeout=30)
    envelope = direct.headers["x-owngate-attest"].encode()

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        body = b'{"error":{"message":"no","type":"invalid_request_error"}}'
        head = b"HTTP/1.1 %d Oops\r\ncontent-type: application/json\r\n" % status
        head += b"x-owngate-attest: " + envelope + b"\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return False

    raw = start_raw(answer)
    attested = backend("gpu", raw.url, "m", attest={"key": sidecar.vkey})
    gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
    got = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert got.status_code >= 400
    assert "x-owngate-attest" not in got.headers
    assert b"owngate-attest" not in got.content
    record = completion_record(tmp_path / "log", got.headers["x-request-id"])
    assert "attestation" not in record and record["response_commitment"] is None
    vkey = load_signer(tmp_path / "log.key").vkey
    audit = ["verify", str(tmp_path / "log"), "--key", vkey, "--backend-key", f"gpu={sidecar.vkey}"]
    assert run_audit(audit) == 0
