"""The writer under faults it must survive or refuse: a log directory deleted or replaced
while the log is open, a snapshot or signer that raises, a committer that stops, and the
one line each fault and its end are reported with (docs/provenance.md, "Failures")."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance import (
    LogSettings,
    LogUnavailableError,
    ProvenanceLog,
    Signer,
    verify_log,
)
from gateway.provenance.testing import log_request, seeded_signer

ORIGIN = "gateway.example/log/faults"


def _signer() -> Signer:
    return seeded_signer(ORIGIN)


class Events:
    """What the log reported, as (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def error(self, event: str, **fields: Any) -> None:
        self.lines.append(("error", event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append(("info", event, fields))

    def events(self) -> list[tuple[str, str]]:
        return [(level, event) for level, event, _ in self.lines]


async def _open(path: Path, events: Events | None = None, **settings: float) -> ProvenanceLog:
    reported = {} if events is None else {"events": events}
    return await ProvenanceLog.open(
        path,
        ORIGIN,
        _signer(),
        settings=LogSettings(**settings),  # type: ignore[arg-type]
        **reported,  # type: ignore[arg-type]
    )


def test_a_deleted_log_directory_takes_no_more_appends_even_once_recreated(
    tmp_path: Path,
) -> None:
    # The open segment's file still takes writes once its directory is deleted; they are
    # in no file anyone will read, so acknowledging them served requests the log lost.
    directory = tmp_path / "log"

    async def scenario() -> None:
        log = await _open(directory, group_commit_ms=0, probe_interval_ms=10)
        await log_request(log, 0)  # the segment is open now
        shutil.rmtree(directory)
        with pytest.raises(LogUnavailableError, match="the segment was removed"):
            await log_request(log, 1)
        assert log.last_error is not None and log.size == 2
        directory.mkdir()  # another directory of the same name: not the log
        await asyncio.sleep(0.1)  # probes, all failing
        assert log.last_error is not None
        with pytest.raises(LogUnavailableError):
            await log_request(log, 2)
        with pytest.raises(LogUnavailableError, match="removed or replaced"):
            await log.close()  # the final checkpoint is not signed into the new directory

    asyncio.run(scenario())
    assert list(directory.iterdir()) == []


def test_a_replaced_log_directory_gets_no_segment_or_checkpoint(tmp_path: Path) -> None:
    directory, moved = tmp_path / "log", tmp_path / "moved"

    async def scenario() -> None:
        log = await _open(directory, group_commit_ms=0, checkpoint_interval_ms=3_600_000)
        await log_request(log, 0)
        await log.checkpoint()  # its snapshot closed the segment: the next append opens one
        directory.rename(moved)
        directory.mkdir()
        with pytest.raises(LogUnavailableError, match="removed or replaced"):
            await log_request(log, 1)
        await log.close()  # nothing new to sign

    asyncio.run(scenario())
    assert list(directory.iterdir()) == []
    # The log as it was, where it went, is whole: the next start there recovers it.
    assert verify_log(moved, [_signer().verifier()]).size == 2
