"""`ProvenanceLog.withdraw`: a record `append_soon` queued is taken back while no write made
it durable or holds it (queued, or kept after a refused write), never after. The request
path takes back the completion of a failed attempt when the log refused the next
attempt's dispatch record, to write it with the status its client gets."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

import gateway.provenance.writer.segment_writer
from gateway.provenance import (
    LogEntry,
    LogSettings,
    LogUnavailableError,
    ProvenanceLog,
    completion_record,
    dispatch_record,
    verify_log,
)
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.testing import EXAMPLE_BACKEND, EXAMPLE_POLICY, seeded_signer
from tests.helpers.provenance import FailingDisk

ORIGIN = "gateway.example/log/replica-1"
_NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _dispatch(request_id: str) -> dict[str, object]:
    return dispatch_record(
        request_id=request_id,
        time=_NOW,
        tenant="acme-app",
        model="m",
        policy=EXAMPLE_POLICY,
        trace=[],
        backend=EXAMPLE_BACKEND,
        fallback_reason=None,
        request_commitment="00" * 32,
    )


def _completion(request_id: str, dispatch: LogEntry, status: int) -> dict[str, object]:
    return completion_record(
        request_id=request_id,
        time=_NOW,
        dispatch=dispatch,
        status=status,
        error=None,
        usage=None,
        latency_ms=1,
        response_commitment=None,
    )


async def _open(path: Path) -> ProvenanceLog:
    signer = seeded_signer(ORIGIN)
    return await ProvenanceLog.open(path, ORIGIN, signer, settings=LogSettings(group_commit_ms=0))


def test_a_queued_record_is_taken_back_and_a_durable_one_is_not(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path)
        first = await log.append(_dispatch("req-1"))
        queued = log.append_soon(_completion("req-1", first, 502))
        assert log.withdraw(queued)  # not written yet
        assert queued.cancelled()
        assert not log.withdraw(queued)  # once only
        written = log.append_soon(_completion("req-1", first, 499))
        await written
        assert not log.withdraw(written)  # durable: too late
        await log.close()

    asyncio.run(scenario())
    summary = verify_log(tmp_path, [seeded_signer(ORIGIN).verifier()])
    statuses = [r.data.get("status") for _, r in LogDirectory(tmp_path).records(2)]
    assert (summary.size, statuses) == (2, [None, 499])


def test_a_record_kept_after_a_refused_write_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FailingDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)

    async def scenario() -> None:
        log = await _open(tmp_path)
        first = await log.append(_dispatch("req-1"))
        disk.failing = True
        kept = log.append_soon(_completion("req-1", first, 502))
        with pytest.raises(LogUnavailableError):  # the batch both were in: refused
            await log.append(_dispatch("req-2"))
        assert not kept.done()  # kept, to be written once the disk is back
        assert log.withdraw(kept)
        disk.failing = False
        await log.append(_completion("req-1", first, 499))
        await log.close()

    asyncio.run(scenario())
    statuses = [r.data.get("status") for _, r in LogDirectory(tmp_path).records(2)]
    assert statuses == [None, 499]  # the kept 502 was never written
