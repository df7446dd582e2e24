"""What the log says when the client leaves while its final answer is being readied: the
receipt still being signed, the tenant's charge (a Redis call with shared state) still
running, after the request's last attempt ended.

An error answer (every attempt failed, or a fault of the gateway's own) is sent by the
app once the proxy is done, so a client that left meanwhile got nothing: the request's
last completion must say 499, not the 502 (500) the client never received. A whole
answer and a stream's end are readied while the disconnect watch still runs: the same
race leaves them 499 too, the whole answer committed to nothing, the stream to the bytes
that went out before its end; but a stream whose `[DONE]` event went out before was read
whole by its client (the SDKs stop and close there): 200, committed to those bytes
(tests/integration/test_log_truth_left_at_done.py).

Each test holds the gateway (a real listener on its own loop) at one await, closes the
client's socket, waits until the gateway's listener saw the connection go, and lets it
go on.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.trail import Trail
from gateway.provenance import commit, load_signer
from gateway.state import Admission
from tests.helpers.audit_rig import (
    first_request_settled,
    logged,
    request_log,
    whole_answer,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.hold import Hold
from tests.helpers.hooked_gateway import lost_seen
from tests.helpers.log_truth import CHAT, DONE, EVENT, salt_of
from tests.helpers.provenance import run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer, sse_head
from tests.helpers.waiting import until

_FAILS = whole_answer(500, b'{"error":{"message":"down"}}', b"content-type: application/json")
_ANSWER = b'{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
_HOLDS = {"receipt": (Trail, "sealed_receipt"), "charge": (Admission, "release")}


def _leave_while_held(
    gateway: Gateway,
    ask: dict[str, Any],
    hold: Hold,
    seen: threading.Event,
    before: bytes = b"",
) -> bytes:
    """Send `ask` on a raw connection, read the body up to `before` (a stream's events,
    chunked), close it once the gateway is held, and let the gateway go on once its
    listener saw the close; the body the client got (dechunked)."""
    body = json.dumps(ask).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n"
        % (gateway.key.encode(), len(body))
    )
    got = b""
    try:
        with socket.create_connection((gateway.server.host, gateway.server.port), 10) as client:
            client.sendall(head + body)
            assert hold.entered.wait(30)
            while before and not _dechunked(got).endswith(before):
                chunk = client.recv(65536)  # bounded by the socket's timeout
                assert chunk, got
                got += chunk
        assert seen.wait(30), "the gateway did not see the client go"
    finally:
        hold.released.set()
    until(lambda: not gateway.app.serving, "the request ended", timeout=30)
    return _dechunked(got)


def _dechunked(raw: bytes) -> bytes:
    """The body of a chunked answer read so far (whole chunks only)."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while b"\r\n" in rest:
        size, _, rest = rest.partition(b"\r\n")
        length = int(size, 16)
        if len(rest) < length + 2:
            break
        body, rest = body + rest[:length], rest[length + 2 :]
    return body


def _last_records(tmp_path: Path, vkey: str) -> list[dict[str, Any]]:
    """The one request's records, once every dispatch has its completion, signed."""
    logdir = tmp_path / "log"
    found = request_log(logdir, vkey, first_request_settled(logdir, vkey))
    key = load_signer(tmp_path / "log.key").vkey
    assert run_audit(["verify", str(logdir), "--key", key]) == 0
    return found


def _whole_asked_and_left(
    monkeypatch: pytest.MonkeyPatch,
    held_at: tuple[type, str],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    backends: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """A whole answer asked of a logged gateway over `backends`, the client gone while the
    gateway is held at `held_at` (a class and its method): the request's records."""
    seen = lost_seen(monkeypatch)
    hold = Hold(monkeypatch, *held_at)
    gateway, vkey = logged(start_gateway, tmp_path, backends)
    _leave_while_held(gateway, {**CHAT, "stream": False}, hold, seen)
    return _last_records(tmp_path, vkey)


@pytest.mark.parametrize("held", sorted(_HOLDS))
def test_a_client_gone_before_its_error_went_out_is_recorded_499(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    held: str,
) -> None:
    """Every attempt failed (two backends answering 500: the client would get 502), and
    the client leaves while the error's receipt is signed (the charge runs): it got
    nothing, so the last completion says 499, its error the attempt's own failure."""
    backends = [backend(n, start_raw(writes(_FAILS)).url, "m") for n in ("a", "b")]
    mine = _whole_asked_and_left(monkeypatch, _HOLDS[held], start_gateway, tmp_path, backends)
    assert [r["type"] for r in mine] == ["dispatch", "completion"] * 2
    assert mine[1]["status"] == 502, mine[1]  # the first attempt's: another followed
    assert mine[-1]["status"] == 499, mine[-1]
    assert mine[-1]["error"] is not None and mine[-1]["response_commitment"] is None


def test_a_client_gone_before_its_fault_answer_went_out_is_recorded_499(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault of the gateway's own in the relay (the client would get 500) and the
    client gone while the 500's receipt is signed: the completion says 499. The fault must
    have run: a 404 the relay translates as usual is also recorded 499 once its client left,
    so a patch that no longer reaches the relay's call (the name moved to another module)
    would leave this test passing on the 404 path."""
    faults: list[int] = []

    def faulty(*_args: object) -> None:
        faults.append(1)
        raise RuntimeError("a bug")

    monkeypatch.setattr("gateway.api.passthrough.translate_upstream_error", faulty)
    not_found = writes(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
    backends = [backend("a", start_raw(not_found).url, "m")]
    mine = _whole_asked_and_left(
        monkeypatch, (Trail, "sealed_receipt"), start_gateway, tmp_path, backends
    )
    assert faults, "the relay never called the faulty translation (the patch missed it)"
    assert [r["type"] for r in mine] == ["dispatch", "completion"]
    assert mine[-1]["status"] == 499, mine[-1]
    assert mine[-1]["response_commitment"] is None


@pytest.mark.parametrize("held", sorted(_HOLDS))
def test_a_client_gone_before_its_whole_answer_went_out_is_recorded_499(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    held: str,
) -> None:
    """A whole answer, the client gone while its receipt is signed (the charge runs):
    the answer never went out, so the record says 499 and commits to nothing."""
    backends = [backend("a", start_raw(json_answer(_ANSWER)).url, "m")]
    mine = _whole_asked_and_left(monkeypatch, _HOLDS[held], start_gateway, tmp_path, backends)
    assert [r["type"] for r in mine] == ["dispatch", "completion"]
    assert mine[-1]["status"] == 499, mine[-1]
    assert mine[-1]["response_commitment"] is None
    assert mine[-1]["usage"] is not None  # the backend reported it: the record keeps it


@pytest.mark.parametrize("done", [True, False], ids=["with-done", "without-done"])
@pytest.mark.parametrize("held", sorted(_HOLDS))
def test_a_stream_whose_end_could_not_go_out_is_recorded_as_what_its_client_read(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    held: str,
    done: bool,
) -> None:
    """A stream relayed whole, the client gone while its end (the receipt line) is
    readied: the client got the events, not the end nor the receipt. With the `[DONE]`
    event among them it read the whole answer (the SDKs stop and close there), so the
    record says 200 (before: 499, for an answer its client read whole); without it,
    499. Either way it commits to the events the client got."""
    events = EVENT + DONE if done else EVENT

    async def stream(writer: asyncio.StreamWriter, _post: Post) -> bool:
        # chunked: without `[DONE]`, the last chunk is the stream's end
        writer.write(sse_head(b"transfer-encoding: chunked\r\n"))
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(events), events))
        await writer.drain()
        return False

    seen = lost_seen(monkeypatch)
    hold = Hold(monkeypatch, *_HOLDS[held])
    gateway, vkey = logged(start_gateway, tmp_path, [backend("a", start_raw(stream).url, "m")])
    got = _leave_while_held(gateway, CHAT, hold, seen, before=events)
    assert got == events
    mine = _last_records(tmp_path, vkey)
    assert [r["type"] for r in mine] == ["dispatch", "completion"]
    assert mine[-1]["status"] == (200 if done else 499), mine[-1]
    assert mine[-1]["error"] is None if done else mine[-1]["error"] is not None, mine[-1]
    # Its receipt line never reached the client; the receipt path gives it (the salt).
    rid = mine[-1]["request_id"]
    url = f"{gateway.url}/v1/provenance/receipts/{rid}"
    receipt = httpx.get(url, headers=gateway.headers, timeout=10).content
    _, salt = salt_of(receipt)
    assert mine[-1]["response_commitment"] == commit("response", salt, events)
