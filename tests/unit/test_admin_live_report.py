"""The admin report of the live log (gateway/admin/report.py): a checkpoint written while
the report reads the log (its history file first, then its `checkpoint` file) must not
turn a sound log into a FAILED report; a failure on a log that did not move stays one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from gateway.admin.report import ATTEMPTS, log_state, read_live
from gateway.provenance import ProvenanceLog
from gateway.provenance.audit.report import Invocation, audit_report
from gateway.provenance.formats.layout import CHECKPOINT
from gateway.provenance.testing import log_request, seeded_signer

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
