"""A streamed answer's receipt (its one `owngate-receipt` comment line) and the checks that
it is the request's, in the log, and commits to exactly the bytes the client got."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import httpx

from gateway.provenance import commit, load_signer
from tests.helpers.provenance import completion_record, run_audit

__all__ = ["CHAT", "DONE", "owngate_lines", "receipt_verifies", "stream_receipt"]


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


DONE = b"data: [DONE]\n\n"


def owngate_lines(body: bytes) -> list[bytes]:
    """The comment lines an SSE parser reads whose text starts with `owngate-`."""
    lines = re.split(rb"\r\n|\r|\n", body)
    return [line for line in lines if re.match(rb":[ \t]*owngate-", line)]


def stream_receipt(response: httpx.Response) -> bytes:
    """The client's receipt: the one `owngate-` line, which is the gateway's, last."""
    (line,) = owngate_lines(response.content)
    assert line.startswith(b": owngate-receipt ")
    assert response.content.endswith(line + b"\n\n")
    return base64.b64decode(line.removeprefix(b": owngate-receipt "))


def receipt_verifies(tmp_path: Path, response: httpx.Response, receipt: bytes, seen: bytes) -> None:
    """The receipt is this request's, the log holds it, and it commits to `seen`: the
    backend's bytes exactly as the client got them (not the gateway's own error event,
    receipt line, or the line end it puts before them)."""
    assert response.content.startswith(seen)
    request_id = response.headers["x-request-id"]
    payload = json.loads(base64.b64decode(json.loads(receipt)["payload"]))
    assert payload["request_id"] == request_id
    record = completion_record(tmp_path / "log", request_id)
    salt = bytes.fromhex(payload["salts"]["response"])
    assert commit("response", salt, seen) == record["response_commitment"]
    path = tmp_path / f"{request_id}.receipt"
    path.write_bytes(receipt)
    key = load_signer(tmp_path / "log.key").vkey
    log = str(tmp_path / "log")
    assert run_audit(["receipt", "verify", str(path), "--key", key, "--log", log]) == 0
    assert run_audit(["verify", log, "--key", key]) == 0
