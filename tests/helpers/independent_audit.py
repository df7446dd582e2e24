"""An auditor's own check that a logged request says what its client received, written
from docs/provenance.md alone (tests/integration/test_log_truth_audit.py runs it).

It imports nothing of `gateway`: the log is read from its C2SP files (the signed-note
`checkpoint`, the `tile/entries` bundles, the RFC 6962 root recomputed over them), the
receipt is checked with the docs' own receipt recipe and the stream's committed body
found with the docs' own `committed_bodies` (both executed from the page, as printed),
and each commitment recomputed with the docs' formula. `audit(...)` returns the
findings for one answer as the client got it: an empty list when the log, the receipt
and the bytes agree.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from openai._streaming import SSEDecoder

from tests.helpers.paths import REPO_ROOT

__all__ = ["Received", "audit", "docs_code", "log_records"]

_WIDTH = 256  # entries per tile (C2SP tlog-tiles)
# The status an error event's code stands for (docs: "502, or 504 for a timeout"; 503 at
# a drain).
_EVENT_STATUS = {"upstream_error": 502, "upstream_timeout": 504, "not_ready": 503}


def docs_code() -> dict[str, Any]:
    """The receipt recipe and `committed_bodies` of docs/provenance.md, executed."""
    text = (REPO_ROOT / "docs" / "provenance.md").read_text()
    recipe = re.search(r"<!-- receipt-recipe -->\n```python\n(.*?)```", text, re.DOTALL)
    bodies = re.search(r"```python\n(import re\n.*?def committed_bodies.*?)```", text, re.DOTALL)
    assert recipe and bodies, "docs/provenance.md lost its recipes"
    namespace: dict[str, Any] = {}
    exec(compile(recipe.group(1), "docs/provenance.md:recipe", "exec"), namespace)
    exec(compile(bodies.group(1), "docs/provenance.md:committed_bodies", "exec"), namespace)
    return namespace


def _commit(kind: str, salt_hex: str, body: bytes) -> str:
    domain = f"owngate/provenance/v1/{kind}-commitment\0".encode()
    salt = bytes.fromhex(salt_hex)
    return hashlib.sha256(domain + salt + hashlib.sha256(body).digest()).hexdigest()


def _leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _root(leaves: list[bytes]) -> bytes:
    """RFC 6962 Merkle tree hash of the leaf hashes `leaves`."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    split = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + _root(leaves[:split]) + _root(leaves[split:])).digest()


def _tile_path(n: int) -> str:
    """C2SP tlog-tiles index encoding: 3-digit groups, all but the last prefixed `x`."""
    groups = []
    while True:
        groups.append(f"{n % 1000:03d}")
        n //= 1000
        if not n:
            break
    return "/".join([f"x{g}" for g in reversed(groups[1:])] + [groups[0]])


def _checkpoint(logdir: Path, vkey: str) -> tuple[str, int, bytes]:
    """The log's `checkpoint`, its signed-note signature by `vkey` checked: origin, size,
    root."""
    note = (logdir / "checkpoint").read_bytes()
    text, _, signatures = note.partition(b"\n\n")
    text += b"\n"
    name, hexid, key = vkey.split("+", 2)
    raw = base64.b64decode(key)
    public = Ed25519PublicKey.from_public_bytes(raw[1:])
    mine = []
    for line in signatures.decode().splitlines():
        dash, signer, encoded = line.split(" ")
        assert dash == "\u2014", "not a signature line"
        blob = base64.b64decode(encoded)
        if signer == name and blob[:4].hex() == hexid:
            mine.append(blob[4:])
    assert mine, "the checkpoint is not signed by the log's key"
    for signature in mine:
        public.verify(signature, text)  # raises InvalidSignature
    origin, size, root = text.decode().split("\n")[:3]
    return origin, int(size), base64.b64decode(root)


def log_records(logdir: Path, vkey: str) -> list[bytes]:
    """Every entry the signed checkpoint covers, read from the entry bundles, the root
    recomputed over them and compared with the signed one."""
    _, size, root = _checkpoint(logdir, vkey)
    entries: list[bytes] = []
    for n in range((size + _WIDTH - 1) // _WIDTH):
        width = min(_WIDTH, size - n * _WIDTH)
        name = _tile_path(n) + (f".p/{width}" if width < _WIDTH else "")  # partial: `.p/<W>`
        bundle = (logdir / "tile" / "entries" / name).read_bytes()
        at = 0
        for _ in range(width):
            length = int.from_bytes(bundle[at : at + 2], "big")
            entries.append(bundle[at + 2 : at + 2 + length])
            at += 2 + length
    assert _root([_leaf(e) for e in entries]) == root, "entries do not hash to the root"
    return entries


@dataclass(frozen=True)
class Received:
    """One answer as a client got it: HTTP status, headers, every body byte, and the
    request body it sent."""

    status: int
    headers: dict[str, str]
    body: bytes
    request: bytes

    @property
    def is_stream(self) -> bool:
        return self.headers.get("content-type", "").lower().startswith("text/event-stream")


def _receipt_of(received: Received) -> bytes | None:
    header = received.headers.get("x-owngate-receipt")
    if header is not None:
        return base64.b64decode(header)
    found = re.search(rb"(?:^|[\r\n]): owngate-receipt ([A-Za-z0-9+/=]*)\n\n\Z", received.body)
    return base64.b64decode(found.group(1)) if found else None


def _client_status(received: Received, gateways: bytes) -> int:
    """The status the client got: the HTTP status, or the one of the error event the
    gateway ended a 200 stream with (in `gateways`, the bytes it wrote after the
    backend's: docs, "the body a client commits to")."""
    if not received.is_stream or received.status != 200:
        return received.status
    events = re.findall(rb'(?:^|[\r\n])data: (\{"error":\{[^\r\n]*\}\})\n\n', gateways)
    if events:
        code = json.loads(events[-1])["error"]["code"]
        return _EVENT_STATUS.get(code, 0)
    return 200


def _events_read(body: bytes) -> tuple[list[dict[str, Any]], bool]:
    """What the OpenAI SDK reads of a stream (its own SSE decoder, openai/_streaming.py):
    the JSON objects of its events up to `[DONE]` or an error event (at which it raises:
    the second value says whether it met one), and up to where the SDK raises: at a line
    that is not UTF-8, at an event whose data `json.loads` refuses (one dispatched
    without data included; docs: the record stops there, except at an event holding no
    usage, error or `[DONE]`, a known limit). An event nested past what `json.loads`
    reads is skipped (whether the client raises depends on its stack); a `thread.*`
    event's data is nested by the SDK's legacy `Stream` (`{"data": ..., "event": ...}`):
    neither its usage nor its error is at the top."""
    read: list[dict[str, Any]] = []
    events = SSEDecoder().iter_bytes(iter([body]))
    while True:
        try:
            event = next(events)
        except (StopIteration, UnicodeDecodeError):
            break
        if event.data.startswith("[DONE]"):
            break
        try:
            doc = json.loads(event.data)
        except RecursionError:
            continue
        except ValueError:
            break
        if event.event and event.event.startswith("thread."):
            continue
        if isinstance(doc, dict) and doc.get("error"):
            return read, True
        if isinstance(doc, dict):
            read.append(doc)
    return read, False


def _reads_done(body: bytes) -> bool:
    """Whether the OpenAI SDK, reading `body`, stops at an event whose data starts
    `[DONE]` (not at an error event, not where it raises, not at the body's end)."""
    events = SSEDecoder().iter_bytes(iter([body]))
    while True:
        try:
            event = next(events)
        except (StopIteration, UnicodeDecodeError):
            return False
        if event.data.startswith("[DONE]"):
            return True
        try:
            doc = json.loads(event.data)
        except RecursionError:
            continue
        except ValueError:
            return False
        if event.event and event.event.startswith("thread."):
            continue
        if isinstance(doc, dict) and doc.get("error"):
            return False


def _raised_by_gateways_blank_line(body: bytes, backend: int) -> bool:
    """Whether the OpenAI SDK, reading `body`, raises at an event that only a blank line
    of the gateway's dispatched (at or past byte `backend`, where the gateway's own bytes
    begin) with no field line of its own since the last event: one the SDK dispatches
    because it keeps the last event id (openai/_streaming.py `SSEDecoder.decode`), whose
    `json()` of "" raises at the end of an answer the client read whole (docs: "A stream
    whose backend gave its events `id` fields ... the empty `id` clears it")."""
    decoder = SSEDecoder()
    fields = False  # a field line since the last event was dispatched
    start = 0
    for end in re.finditer(rb"\r\n|\r|\n", body):
        line, start = body[start : end.start()], end.end()
        try:
            sse = decoder.decode(line.decode("utf-8"))
        except UnicodeDecodeError:
            return False  # the SDK raises there: the backend's line, not a blank one
        if sse is None:
            fields = fields or (bool(line) and not line.startswith(b":"))
            continue
        if sse.data.startswith("[DONE]"):
            return False
        try:
            doc = json.loads(sse.data)
        except RecursionError:
            doc = None
        except ValueError:
            return not fields and end.start() >= backend
        if isinstance(doc, dict) and doc.get("error"):
            return False
        fields = False
    return False


def _usage_seen(received: Received) -> list[Any]:
    """The usages the client was shown (a JSON answer's, a stream's events'), read as the
    OpenAI SDK reads them: objects, or values that are none (`"usage": 7`)."""
    if received.is_stream:
        docs = _events_read(received.body)[0]
    else:
        try:
            docs = [json.loads(received.body)]
        except (ValueError, RecursionError):
            docs = []
    return [d["usage"] for d in docs if isinstance(d, dict) and d.get("usage") is not None]


def _count(value: Any) -> bool:
    """Whether a usage count is one the record states (docs: a whole number 0..2^53)."""
    return type(value) is int and 0 <= value <= 2**53


def audit(
    received: Received,
    logdir: Path,
    vkey: str,
    *,
    later_receipt: bytes | None = None,
    left: bool = False,
) -> list[str]:
    """What is wrong between the answer a client received, its receipt and the log
    (signed checkpoint must cover the request's records); empty when nothing is.
    `later_receipt`: the receipt the client fetched afterwards, which must make the same
    claims (and the only one, for a client that `left` before its stream's end: its
    status is then 499, unless what it received holds the `[DONE]` event its SDK stops
    at, or the backend's error event it raises: it then had the whole answer, docs: "a
    client that leaves once it read `[DONE]`", and the status is the stream's, 200)."""
    code = docs_code()
    findings: list[str] = []
    envelope = _receipt_of(received) if not left else later_receipt
    if envelope is None:
        return ["the answer carries no receipt"]
    claims = code["verify_receipt"](envelope, vkey)
    if claims["request_id"] != received.headers.get("x-request-id"):
        findings.append("the receipt names another request id")
    if later_receipt is not None and code["verify_receipt"](later_receipt, vkey) != claims:
        findings.append("the receipt fetched later makes other claims")
    entries = log_records(logdir, vkey)
    index, salts = claims["index"], claims["salts"]
    if _leaf(entries[index]).hex() != claims["dispatch_hash"]:
        return [*findings, "the entry at the receipt's index is not the one it names"]
    dispatch = json.loads(entries[index])
    if _commit("request", salts["request"], received.request) != dispatch["request_commitment"]:
        findings.append("the request commitment does not open with the bytes sent")
    if dispatch["type"] == "refusal":  # its `reason` is the error code the client got
        try:
            code_got = json.loads(received.body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code_got = None
        if received.status < 400 or dispatch["reason"] != code_got:
            findings.append(f"a refusal for {dispatch['reason']}, the client got {code_got}")
        return findings
    if dispatch["backend"]["id"] != claims["backend"]:
        findings.append("the dispatch record names another backend than the receipt")
    mine = [json.loads(e) for e in entries if json.loads(e)["request_id"] == claims["request_id"]]
    completions = [
        r
        for r in mine
        if r["type"] == "completion"
        and r["dispatch"] == {"index": index, "hash": claims["dispatch_hash"]}
    ]
    if len(completions) != 1:
        return [*findings, f"{len(completions)} completion records link to the dispatch"]
    completion = completions[0]
    if mine[-1] != completion:
        findings.append("the completion of the receipt's dispatch is not the request's last")
    commitment = completion["response_commitment"]
    bodies = code["committed_bodies"](received.body) if received.is_stream else [received.body]
    committed = [b for b in bodies if _commit("response", salts["response"], b) == commitment]
    opened = commitment is not None and bool(committed)
    # What the gateway wrote after the backend's bytes (its error event, its receipt line).
    gateways = received.body[len(committed[0]) :] if committed else received.body
    # A client that left after the backend's error event (its SDK raised it, reads no
    # further) had its stream's end as the SDK reads it (docs: "or the backend's error
    # event"): 200, the error named by `stream_error`, as for a stream that ended there.
    left_at_error = left and received.is_stream and _events_read(received.body)[1]
    if left:
        status = 200 if _reads_done(received.body) or left_at_error else 499
    else:
        status = _client_status(received, gateways)
    if completion["status"] != status:
        findings.append(f"the record says status {completion['status']}, the client got {status}")
    # An error event of the backend's that the client read (its SDK raised it) is named
    # (docs: the completion's `stream_error`).
    if left_at_error and completion.get("stream_error") != "backend":
        findings.append("the client left at the backend's error event: no stream_error")
    if received.is_stream and not left and committed:
        # Its last event, left open, is ended by the gateway's own bytes (both end so).
        backend_error = _events_read(committed[0] + b"\n\n")[1]
        if _raised_by_gateways_blank_line(received.body, len(committed[0])):
            findings.append("the SDK raised at an event only the gateway's blank line made")
        if completion.get("stream_error") != ("backend" if backend_error else None):
            findings.append(
                f"stream_error {completion.get('stream_error')!r}, the client read "
                f"{'an' if backend_error else 'no'} error event of the backend's"
            )
    if commitment is None and status < 400:
        findings.append("no response commitment for an answer the client got")
    elif commitment is not None and not opened:
        findings.append("the response commitment does not open with the bytes received")
    # Usage as shown last, where its counts are whole numbers 0..2^53; one whose counts
    # are not (3.9, "3", -1, 2^53 + 1) is none, never an earlier one (docs: no count is
    # made of them).
    names = ("prompt_tokens", "completion_tokens", "total_tokens")
    seen = _usage_seen(received)
    if seen and not (isinstance(seen[-1], dict) and all(_count(seen[-1].get(n, 0)) for n in names)):
        if completion["usage"] is not None:
            findings.append(f"usage {completion['usage']} in the record, {seen[-1]} shown")
    elif seen and completion["usage"] != {name: seen[-1].get(name, 0) for name in names}:
        findings.append(f"usage {completion['usage']} in the record, {seen[-1]} shown")
    return findings
