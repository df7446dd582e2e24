"""The attest sidecar when its counter file (`attest-counter`, reserved a block of counters
at a time) cannot be written: as when its log cannot be (test_attest_log_outage.py), it
answers 503 `provenance_unavailable` with `retry-after: 1`, which the gateway takes for a
failed attempt, where before a block used up mid-run ended in a generic 500
`internal_error` after the backend had answered. A request that finds no counter
reserved is refused before the backend; one that passed that check while others used up
the block is refused after it, unsigned. No counter is handed out twice, and every one
handed out is in the log. The disk fault is real: a directory where the counter file is
renamed to (the write's rename fails with EISDIR).
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import gateway.attest.notary
from gateway.attest import AttestSettings, AttestThread
from gateway.attest.notary import COUNTER_FILE
from gateway.provenance import write_signing_key
from tests.helpers.provenance import records
from tests.helpers.raw_backend import (
    Answer,
    Post,
    RawBackend,
    completion_body,
    json_answer,
    sse_head,
)
from tests.helpers.waiting import until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_a_counter_file_the_disk_refuses_is_a_503_to_retry(
    start_raw: Callable[..., RawBackend], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway.attest.notary, "COUNTER_BLOCK", 1)  # one counter per write
    release = threading.Event()
    raw = start_raw(json_answer(completion_body("ok"), release=release))
    write_signing_key(tmp_path / "attest.key", "gpu")
    log_dir = tmp_path / "log"
    settings = AttestSettings(
        backend=raw.url, key_file=tmp_path / "attest.key", log_dir=log_dir, flush_ms=5.0
    )
    sidecar = AttestThread(settings)
    sidecar.start()
    handed: list[int] = []

    def ask() -> httpx.Response:
        answer = httpx.post(f"{sidecar.url}/v1/chat/completions", json=CHAT, timeout=30)
        if answer.status_code == 200:
            envelope = json.loads(base64.b64decode(answer.headers["x-owngate-attest"]))
            handed.append(json.loads(base64.b64decode(envelope["payload"]))["counter"])
        else:
            assert "x-owngate-attest" not in answer.headers
        return answer

    def refused_for_the_counter(answer: httpx.Response) -> None:
        assert answer.status_code == 503, answer.text
        assert answer.headers.get("retry-after") == "1", answer.headers
        error = answer.json()["error"]
        assert error["code"] == "provenance_unavailable", error
        assert "counter file" in error["message"], error

    try:
        # Two requests pass the check with counter 0 reserved, and wait at the backend.
        with ThreadPoolExecutor(2) as pool:
            both = [pool.submit(ask) for _ in range(2)]
            until(lambda: len(raw.posts) == 2, "both requests at the backend")
            counter = log_dir / COUNTER_FILE
            counter.unlink()
            (counter / "held").mkdir(parents=True)  # the rename onto it fails
            release.set()
            answers = sorted((future.result() for future in both), key=lambda a: a.status_code)
        assert answers[0].status_code == 200, answers[0].text
        refused_for_the_counter(answers[1])  # after the backend answered: not signed
        refused_for_the_counter(ask())  # none reserved now: refused before the backend
        assert len(raw.posts) == 2
        shutil.rmtree(counter)
        assert ask().status_code == 200  # the disk takes it again
    finally:
        sidecar.stop()
    assert sidecar.relay.shutdown_error is None
    assert sidecar.listener.errors == 0  # no relay failure: a refusal, as for the log
    assert handed == [0, 1]
    assert sorted(record["counter"] for record in records(log_dir)) == handed


STREAM = b"data: {}\n\ndata: [DONE]\n\n"


def _stream(release: threading.Event) -> Answer:
    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        writer.write(sse_head(b"content-length: %d\r\n" % len(STREAM)) + STREAM)
        await writer.drain()
        return False

    return answer


def test_a_stream_whose_counter_cannot_be_reserved_ends_unsigned_not_as_a_relay_failure(
    start_raw: Callable[..., RawBackend], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream's head is sent before its end is countersigned: the refusal can only cut
    # it (the gateway takes a stream without its comment for a failed attempt). Before,
    # the OSError was a relay failure: its traceback logged, counted in `errors`.
    monkeypatch.setattr(gateway.attest.notary, "COUNTER_BLOCK", 1)
    release = threading.Event()
    raw = start_raw(_stream(release))
    write_signing_key(tmp_path / "attest.key", "gpu")
    log_dir = tmp_path / "log"
    settings = AttestSettings(backend=raw.url, key_file=tmp_path / "attest.key", log_dir=log_dir)
    sidecar = AttestThread(settings)
    sidecar.start()

    def ask() -> bytes | None:
        """The stream's bytes, None when it broke off."""
        ask = {**CHAT, "stream": True}
        try:
            with httpx.stream(
                "POST", f"{sidecar.url}/v1/chat/completions", json=ask, timeout=30
            ) as answer:
                assert answer.status_code == 200
                return answer.read()
        except httpx.RemoteProtocolError:
            return None

    try:
        with ThreadPoolExecutor(2) as pool:
            both = [pool.submit(ask) for _ in range(2)]
            until(lambda: len(raw.posts) == 2, "both requests at the backend")
            counter = log_dir / COUNTER_FILE
            counter.unlink()
            (counter / "held").mkdir(parents=True)
            release.set()
            bodies = [future.result() for future in both]
    finally:
        sidecar.stop()
    signed = [body for body in bodies if body is not None]
    assert len(signed) == 1 and b": owngate-attest " in signed[0], bodies
    assert sidecar.listener.errors == 0
