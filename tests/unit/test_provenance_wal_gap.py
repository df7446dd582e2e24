"""Entries deleted from the write-ahead segments before a checkpoint covered them.

The writer refuses to open such a log (`LogCorruptedError`: a segment starting past the
log's end); `audit verify` and `audit report` used to call it fine, counting the entries
after the gap as "not yet in a checkpoint".
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.provenance import ProvenanceLog
from gateway.provenance.formats.wal import list_segments
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "test.owngate/wal-gap"
SIGNER = seeded_signer(ORIGIN)


def _crashed_log(path: Path) -> None:
    """One request checkpointed (entries 0-1), three more only in the segment (2-7)."""

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        await log_request(log, 0)
        await log.checkpoint()
        for number in range(1, 4):
            await log_request(log, number)
        await log.abort()  # a crash: no final checkpoint

    asyncio.run(build())


def test_unsigned_entries_after_a_crash_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _crashed_log(tmp_path)
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey]) == 0
    assert "6 entries not yet in a checkpoint" in capsys.readouterr().out


def test_a_gap_in_the_write_ahead_segments_fails_verify_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _crashed_log(tmp_path)
    [(first, segment)] = list_segments(tmp_path / "wal")
    assert first == 2
    segment.rename(segment.with_name(f"{5:020d}.wal"))  # entries 2..4 vanish
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey]) == 1
    assert "entries 2..4 are missing" in capsys.readouterr().err
    report = tmp_path.parent / "report.json"
    code = run_audit(["report", str(tmp_path), "--key", SIGNER.vkey, "--json", str(report)])
    verification = json.loads(report.read_text())["verification"]
    assert code == 1 and verification["ok"] is False and verification["index"] == 2
