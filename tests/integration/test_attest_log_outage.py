"""The attest sidecar when its log's disk fails (docs/provenance.md, layer 3: "While its
log cannot be written the sidecar answers 503 `provenance_unavailable`"): answers
countersigned before it knew are kept and written once the disk takes writes again, new
requests are refused 503 (with `retry-after: 1`, as the gateway's own) and reach no
backend while it cannot write, and in the end every
countersignature it handed out is in its log, once. The disk fails as in
test_provenance_full_disk.py (the write-ahead segment's writes fail with EIO while a
flag is set).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import gateway.provenance.writer.segment_writer
from gateway.attest import AttestSettings, AttestThread
from gateway.provenance import write_signing_key
from tests.helpers.gateways import Sim, served
from tests.helpers.provenance import FailingDisk, records
from tests.helpers.waiting import until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_every_countersignature_handed_out_across_a_disk_outage_is_logged(
    start_sim: Callable[..., Sim], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FailingDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    write_signing_key(tmp_path / "attest.key", "gpu")
    settings = AttestSettings(
        backend=sim.url,
        key_file=tmp_path / "attest.key",
        log_dir=tmp_path / "log",
        flush_ms=5.0,
        checkpoint_ms=20.0,
    )
    sidecar = AttestThread(settings)
    sidecar.start()
    handed: list[int] = []
    refused: list[httpx.Response] = []

    def ask() -> int:
        answer = httpx.post(f"{sidecar.url}/v1/chat/completions", json=CHAT, timeout=30)
        if answer.status_code == 200:
            envelope = json.loads(base64.b64decode(answer.headers["x-owngate-attest"]))
            handed.append(json.loads(base64.b64decode(envelope["payload"]))["counter"])
        else:
            assert "x-owngate-attest" not in answer.headers
            refused.append(answer)
        return answer.status_code

    try:
        assert ask() == 200
        disk.failing = True
        until(lambda: ask() == 503, "the sidecar refusing while its log cannot be written")
        error = refused[-1].json()["error"]
        assert error["code"] == "provenance_unavailable", error
        # as the gateway's own 503 for its log: the disk is retried each second
        assert refused[-1].headers.get("retry-after") == "1", refused[-1].headers
        relayed = served(sim)
        assert ask() == 503 and served(sim) == relayed  # refused before the backend
        disk.failing = False
        until(lambda: ask() == 200, "the sidecar serving again once its log is written")
    finally:
        disk.failing = False
        sidecar.stop()
    assert len(handed) >= 2 and len(handed) == len(set(handed))  # before and after
    logged = [record["counter"] for record in records(tmp_path / "log")]
    assert sorted(logged) == sorted(handed)


def test_a_countersignature_the_disk_never_took_makes_the_stop_unclean(
    start_sim: Callable[..., Sim], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that does not come back before the sidecar stops: the statement it handed
    out is not in its log (the cross-check reports it), and the stop says so
    (`shutdown_error`; `owngate attest` exits 4), where before it ended as a clean one."""
    disk = FailingDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    write_signing_key(tmp_path / "attest.key", "gpu")
    settings = AttestSettings(
        backend=sim.url, key_file=tmp_path / "attest.key", log_dir=tmp_path / "log"
    )
    sidecar = AttestThread(settings)
    sidecar.start()
    disk.failing = True  # the log has written nothing yet: its first statement fails
    try:
        answer = httpx.post(f"{sidecar.url}/v1/chat/completions", json=CHAT, timeout=30)
        # handed out before the write was tried: the answer does not wait for the log
        assert answer.status_code == 200 and "x-owngate-attest" in answer.headers
    finally:
        sidecar.stop()
        disk.failing = False
    assert records(tmp_path / "log") == []
    assert sidecar.relay.shutdown_error == (
        "owngate attest: 1 countersignature(s) handed out are not in its log"
    )
