"""An attested stream whose client closes at `data: [DONE]` (the sync OpenAI SDK does):
the record is consistent with the two-party rule.

An attested answer is whole only with the countersignature its sidecar writes after the
`[DONE]` (docs/provenance.md: a failure between the two is still the stream breaking
off). So a client that leaves at `[DONE]` before the countersignature came is still
recorded 499, with no countersignature; one that leaves once it was accepted (the gateway
still signing the receipt the stream's end carries) read the answer the statement covers:
200 with the accepted countersignature (before: 499), and `audit verify --backend-key`
holds it to the backend's key. The fake sidecar signs with a key the gateway is given,
over the gateway's own salts (as tests/integration/test_attest_stream_cut.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from openai._streaming import SSEDecoder

from gateway.api.trail import Trail
from gateway.provenance import load_signer, write_signing_key
from tests.helpers.attest import countersignature_comment
from tests.helpers.audit_rig import client_gets
from tests.helpers.gateways import Gateway, backend, logged_gateway
from tests.helpers.hold import Hold
from tests.helpers.hooked_gateway import lost_seen
from tests.helpers.provenance import completion_record, run_audit
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.waiting import until

ORIGIN = "gw.test/left-at-done"
STREAM = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _sidecar(key_file: Path, release: threading.Event | None, stream: bytes = b"") -> Answer:
    """A sidecar's chunked stream: `stream` (`STREAM`), then (without `release`) its
    countersignature comment and the last chunk; with it, nothing more until the test is
    done (60 s)."""
    stream = stream or STREAM
    signer = load_signer(key_file)

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(stream), stream))
        await writer.drain()
        if release is not None:
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
            return False
        comment = countersignature_comment(post, signer, stream)
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(comment), comment))
        await writer.drain()
        return False

    return answer


def _read_done(body: bytes) -> bool:
    """The OpenAI SDK's decoder has read the `[DONE]` event: its client closes there."""
    return any(e.data.startswith("[DONE]") for e in SSEDecoder().iter_bytes(iter([body])))


def _audited(tmp_path: Path, sidecar_vkey: str) -> int:
    vkey = load_signer(tmp_path / "log.key").vkey
    logdir = str(tmp_path / "log")
    return run_audit(["verify", logdir, "--key", vkey, "--backend-key", f"gpu={sidecar_vkey}"])


def test_a_client_closing_at_done_after_the_countersignature_is_recorded_200_countersigned(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sidecar_vkey = write_signing_key(tmp_path / "sidecar.key", "gpu")
    seen = lost_seen(monkeypatch)
    hold = Hold(monkeypatch, Trail, "sealed_receipt")
    raw = start_raw(_sidecar(tmp_path / "sidecar.key", None))
    attested = backend("gpu", raw.url, "m", attest={"key": sidecar_vkey})
    gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
    try:
        # The client closes at `[DONE]` once the gateway readied the stream's end (it judged
        # the countersignature then): closing at once may come before the countersignature
        # is read, which is the 499 case below, not this one.
        received = client_gets(
            gateway, CHAT, enough=lambda body: _read_done(body) and hold.entered.wait(30)
        )
        assert hold.entered.wait(30), "the gateway never readied the stream's end"
        assert seen.wait(30), "the gateway did not see the client go"
    finally:
        hold.released.set()
    until(lambda: not gateway.app.serving, "the request ended", timeout=30)
    assert received.body == STREAM  # the countersignature comment is the receipt's
    record = completion_record(tmp_path / "log", received.headers["x-request-id"])
    assert (record["status"], record["error"]) == (200, None), record
    assert record["attestation"]["failure"] is None and record["attestation"]["sig"], record
    assert _audited(tmp_path, sidecar_vkey) == 0


def test_a_client_closing_at_done_before_the_countersignature_is_still_499(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    sidecar_vkey = write_signing_key(tmp_path / "sidecar.key", "gpu")
    release = threading.Event()
    raw = start_raw(_sidecar(tmp_path / "sidecar.key", release))
    attested = backend("gpu", raw.url, "m", attest={"key": sidecar_vkey})
    gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
    try:
        received = client_gets(gateway, CHAT, enough=_read_done)
        record = completion_record(tmp_path / "log", received.headers["x-request-id"])
    finally:
        release.set()
    assert record["status"] == 499, record  # no countersignature: not the whole answer
    assert not (record.get("attestation") or {}).get("sig"), record
    assert _audited(tmp_path, sidecar_vkey) == 0  # an error needs no countersignature


def test_a_countersigned_stream_without_done_cut_at_drain_is_not_countersigned(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No `[DONE]` went out (the countersigned stream has none): the drain deadline's cut
    still ends it with its 503 error event, after the countersigned bytes, so the
    countersignature is not taken (`missing`, 503), as before."""
    sidecar_vkey = write_signing_key(tmp_path / "sidecar.key", "gpu")
    hold = Hold(monkeypatch, Trail, "sealed_receipt")
    event = STREAM.split(b"data: [DONE]")[0]
    raw = start_raw(_sidecar(tmp_path / "sidecar.key", None, event))
    attested = backend("gpu", raw.url, "m", attest={"key": sidecar_vkey})
    gateway = logged_gateway(
        start_gateway, tmp_path, [attested], ORIGIN, limits={"drain_timeout_s": 0.001}
    )

    def drain_once_held() -> None:
        # the stream's end (its countersignature judged), held until the cut ends it
        if hold.entered.wait(30):
            (task,) = list(gateway.app.serving)  # the request: its loop is the server's
            task.get_loop().call_soon_threadsafe(gateway.app.begin_drain)
        else:
            hold.released.set()

    cutter = threading.Thread(target=drain_once_held)
    cutter.start()
    try:
        received = client_gets(gateway, CHAT)
    finally:
        hold.released.set()
        cutter.join(60)
    assert received.body.startswith(event) and b'"not_ready"' in received.body, received.body
    record = completion_record(tmp_path / "log", received.headers["x-request-id"])
    assert record["status"] == 503, record
    assert record["attestation"]["failure"] == "missing", record
    assert _audited(tmp_path, sidecar_vkey) == 0
