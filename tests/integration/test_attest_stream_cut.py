"""A stream cut after its countersignature comment (the connection closes before the
chunked body's last chunk): the gateway breaks the stream off with its own error event
after the backend's bytes, so the client did not get the answer the statement covers
(docs/provenance.md: "a countersigned stream is whole: the gateway writes nothing after
it but its receipt line"). The record must not carry it as accepted, nor the client's
receipt: before, the record said status 502 with an accepted countersignature and the
receipt carried it, which the client's own `receipt verify --response-body` refused.
The fake sidecar signs with a key the gateway is given, over the gateway's own salts.

The client's receipt of that error answer carries no countersignature, as no error answer
does: `owngate audit receipt verify --log --backend-key` takes the log's completion (an
error status, no countersignature accepted) for it, as `audit verify --backend-key` does.
Before, it failed every such receipt (`backend gpu is attested, but the receipt carries no
countersignature`), so a client could not verify the honest receipt of a failed answer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.provenance import load_signer, write_signing_key
from tests.helpers.attest import countersignature_comment
from tests.helpers.gateways import Gateway, backend, logged_gateway
from tests.helpers.provenance import completion_record, run_audit, run_audit_output
from tests.helpers.raw_backend import Answer, Post, RawBackend

ORIGIN = "gw.test/stream-cut"
STREAM = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _cut_after_the_comment(key_file: Path) -> Answer:
    """A sidecar whose stream, countersigned, loses its connection before its last chunk."""
    signer = load_signer(key_file)

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        chunks = [STREAM, countersignature_comment(post, signer, STREAM)]
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
        )
        await writer.drain()
        return False  # closed: no `0` chunk

    return answer


def _cut_stream(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> tuple[str, httpx.Response]:
    """The sidecar's vkey and the answer of a stream cut after its countersignature."""
    sidecar_vkey = write_signing_key(tmp_path / "sidecar.key", "gpu")
    raw = start_raw(_cut_after_the_comment(tmp_path / "sidecar.key"))
    attested = backend("gpu", raw.url, "m", attest={"key": sidecar_vkey})
    gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    return sidecar_vkey, answer


def _checkpointed(log_dir: Path, size: int, deadline_s: float = 30.0) -> None:
    """Wait (bounded) until the log's checkpoint covers `size` entries."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        checkpoint = log_dir / "checkpoint"
        if checkpoint.exists() and int(checkpoint.read_text().split("\n")[1]) >= size:
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint of {size} entries within {deadline_s} s")


def test_a_stream_cut_after_its_countersignature_is_not_countersigned(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    sidecar_vkey, answer = _cut_stream(start_raw, start_gateway, tmp_path)
    assert answer.status_code == 200  # the head went out before the break
    body, _, line = answer.content.partition(b": owngate-receipt ")
    assert body.startswith(STREAM) and b'"code":"upstream_error"' in body[len(STREAM) :]
    receipt = json.loads(base64.b64decode(line.split(b"\n")[0]))
    assert "attestation" not in receipt
    record = completion_record(tmp_path / "log", answer.headers["x-request-id"])
    assert record["status"] == 502
    assert record["attestation"]["failure"] == "missing"
    assert record["attestation"]["sig"] is None
    vkey = load_signer(tmp_path / "log.key").vkey
    audit = ["verify", str(tmp_path / "log"), "--key", vkey, "--backend-key", f"gpu={sidecar_vkey}"]
    assert run_audit(audit) == 0  # an error the backend did not countersign: no claim


def test_the_receipt_of_the_cut_streams_error_answer_verifies_with_the_log(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    sidecar_vkey, answer = _cut_stream(start_raw, start_gateway, tmp_path)
    line = answer.content.partition(b": owngate-receipt ")[2].split(b"\n")[0]
    receipt = tmp_path / "receipt.json"
    receipt.write_bytes(base64.b64decode(line))
    _checkpointed(tmp_path / "log", 2)  # the dispatch and its completion
    vkey = load_signer(tmp_path / "log.key").vkey
    check = [
        "receipt",
        "verify",
        str(receipt),
        "--key",
        vkey,
        "--backend-key",
        f"gpu={sidecar_vkey}",
    ]
    code, said = run_audit_output([*check, "--log", str(tmp_path / "log")])
    assert code == 0, said
    assert "says status 502: an error answer" in said
    # Its bodies have no countersignature to open: the log's commitments are audit open's.
    with_body = [*check, "--log", str(tmp_path / "log"), "--request-body", str(receipt)]
    code, said = run_audit_output(with_body)
    assert code == 2 and "error answer" in said and "the receipt carries none" in said
    # Without the log nothing says the answer was an error: no countersignature fails.
    code, said = run_audit_output(check)
    assert code == 1 and "carries no countersignature" in said
