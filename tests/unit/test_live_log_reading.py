"""Reading a live log: a checkpoint written while the admin report
(gateway/admin/report.py) or `owngate audit verify` reads the log (its history file
first, then its `checkpoint` file) must not turn a sound log into a FAILED verdict; a
failure on a log that did not move stays one."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.admin.report import ATTEMPTS, read_live
from gateway.cli import audit_report as audit_report_cli
from gateway.cli import audit_verify
from gateway.provenance import ProvenanceLog, verify_log
from gateway.provenance.audit.reader import log_state
from gateway.provenance.audit.report import Invocation, audit_report
from gateway.provenance.formats.layout import CHECKPOINT
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "gateway.example/log/live"
SIGNER = seeded_signer(ORIGIN)


def _report(path: Path) -> dict[str, Any]:
    run = Invocation(str(path), ("--key", SIGNER.vkey))
    return audit_report(path, [SIGNER.verifier()], run, now=time.time())


def test_a_checkpoint_landing_during_the_report_is_read_again(tmp_path: Path) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any], int]:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, SIGNER)
        await log_request(log, 1)
        await log.checkpoint()
        earlier = (tmp_path / CHECKPOINT).read_bytes()
        await log_request(log, 2)
        await log.checkpoint()
        await log.close()
        later = (tmp_path / CHECKPOINT).read_bytes()
        # The export is half done: the new history file is written, the checkpoint file
        # not yet (the order the store writes them in).
        (tmp_path / CHECKPOINT).write_bytes(earlier)
        mid_export = _report(tmp_path)
        readings = 0

        async def reading() -> dict[str, Any]:
            nonlocal readings
            readings += 1
            found = _report(tmp_path)
            (tmp_path / CHECKPOINT).write_bytes(later)  # ... and now the export is done
            return found

        async def state() -> object:
            return log_state(tmp_path)

        return mid_export, await read_live(reading, state), readings

    mid_export, report, readings = asyncio.run(scenario())
    assert mid_export["verification"]["ok"] is False  # what one reading saw: "rollback"
    assert "rollback" in mid_export["verification"]["error"]
    assert report["verification"]["ok"] is True and readings == 2


def test_a_failure_on_a_log_that_did_not_move_is_the_answer() -> None:
    readings = 0

    async def reading() -> dict[str, Any]:
        nonlocal readings
        readings += 1
        return {"verification": {"ok": False, "error": "rollback"}}

    async def still() -> object:
        return "same"

    report = asyncio.run(read_live(reading, still))
    assert report["verification"]["ok"] is False and readings == 1


def test_a_log_that_keeps_moving_is_read_a_bounded_number_of_times() -> None:
    readings = 0
    moves = iter(range(1000))

    async def reading() -> dict[str, Any]:
        nonlocal readings
        readings += 1
        return {"verification": {"ok": False, "error": "changed"}}

    async def moving() -> object:
        return next(moves)

    report = asyncio.run(read_live(reading, moving))
    assert report["verification"]["ok"] is False and readings == ATTEMPTS


def _half_exported(path: Path) -> bytes:
    """A log whose second checkpoint is half written (its history file, not yet the
    `checkpoint` file); returns what the `checkpoint` file holds once it is done."""

    async def build() -> bytes:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        await log_request(log, 1)
        await log.checkpoint()
        earlier = (path / CHECKPOINT).read_bytes()
        await log_request(log, 2)
        await log.checkpoint()
        await log.close()
        later = (path / CHECKPOINT).read_bytes()
        (path / CHECKPOINT).write_bytes(earlier)
        return later

    return asyncio.run(build())


def test_audit_verify_of_a_live_log_reads_it_again_when_a_checkpoint_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    later = _half_exported(tmp_path)
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey]) == 1  # "rollback"
    assert "rollback" in capsys.readouterr().err
    readings = 0

    def verify_then_finish_the_export(*args: Any, **kwargs: Any) -> Any:
        nonlocal readings
        readings += 1
        try:
            return verify_log(*args, **kwargs)
        finally:
            (tmp_path / CHECKPOINT).write_bytes(later)

    monkeypatch.setattr(audit_verify, "verify_log", verify_then_finish_the_export)
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["size"] == 4 and readings == 2


def test_audit_verify_reports_a_rollback_that_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _half_exported(tmp_path)  # never finished: an old checkpoint file served for good
    readings = 0

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal readings
        readings += 1
        return verify_log(*args, **kwargs)

    monkeypatch.setattr(audit_verify, "verify_log", counted)
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey]) == 1
    assert "rollback" in capsys.readouterr().err and readings == 1


def test_audit_report_of_a_live_log_reads_it_again_when_a_checkpoint_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logdir = tmp_path / "log"
    later = _half_exported(logdir)
    out = tmp_path / "report.json"
    argv = ["report", str(logdir), "--key", SIGNER.vkey, "--json", str(out)]
    assert run_audit(argv) == 1  # one reading, mid-export: "rollback"
    assert "rollback" in json.loads(out.read_text())["verification"]["error"]
    readings = 0

    def report_then_finish_the_export(*args: Any, **kwargs: Any) -> Any:
        nonlocal readings
        readings += 1
        try:
            return audit_report(*args, **kwargs)
        finally:
            (logdir / CHECKPOINT).write_bytes(later)

    monkeypatch.setattr(audit_report_cli, "audit_report", report_then_finish_the_export)
    assert run_audit(argv) == 0
    assert json.loads(out.read_text())["verification"]["ok"] is True and readings == 2
