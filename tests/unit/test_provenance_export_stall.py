"""A checkpoint export that does not return (tiles on a hung mount) is a fault with its
age as a metric; one that is slow but live is not, before its own limit
(`LogSettings.export_stall_after_ms`, `provenance.export_stall_after_s`, default 60 s),
longer than a write batch's `stall_after_ms` (5 s)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance import LogSettings, ProvenanceLog, Signer, verify_log
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.provenance import Held
from tests.helpers.waiting import until_async

ORIGIN = "gateway.example/log/export-stall"


def _signer() -> Signer:
    return seeded_signer(ORIGIN)


class Events:
    """What the log reported, as (level, event)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def error(self, event: str, **_fields: Any) -> None:
        self.lines.append(("error", event))

    def info(self, event: str, **_fields: Any) -> None:
        self.lines.append(("info", event))


async def _open(path: Path, events: Events, **settings: float) -> ProvenanceLog:
    return await ProvenanceLog.open(
        path,
        ORIGIN,
        _signer(),
        settings=LogSettings(**settings),  # type: ignore[arg-type]
        events=events,
    )


def test_a_checkpoint_export_that_does_not_return_is_a_fault_and_shows_its_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: an export that hung (tiles on a hung mount) was seen by nothing: readiness
    # stayed green while no checkpoint was signed, and no metric showed it running.
    events = Events()

    async def scenario() -> None:
        log = await _open(
            tmp_path, events, group_commit_ms=0, checkpoint_interval_ms=1, export_stall_after_ms=200
        )
        held = Held(log.store.export)
        monkeypatch.setattr(log.store, "export", held)
        await log_request(log, 0)  # a checkpoint falls due: its export hangs
        await until_async(held.entered.is_set, "the export started", timeout=30.0)
        await until_async(
            lambda: "checkpoint export has not returned" in str(log.last_error),
            "a stalled export",
            timeout=30.0,
        )
        assert log.export_seconds > 0
        await log_request(log, 1)  # appends go on: their records are durable meanwhile
        held.hung = False
        held.release.set()
        await until_async(lambda: log.last_error is None, "the export returned", timeout=30.0)
        await log.close()

    asyncio.run(scenario())
    assert events.lines[:2] == [  # (an export slow under load may stall once more)
        ("error", "provenance checkpoint not signed"),
        ("info", "provenance checkpoints signed again"),
    ]
    assert verify_log(tmp_path, [_signer().verifier()]).size == 4


def test_a_slow_export_is_a_stall_only_past_its_own_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: an export counted as hung after the write batch's stall_after_ms (5 s): a
    # slow but live export of 10,000 entries on a network disk took the replica out of
    # /readyz. Exports have their own limit (export_stall_after_ms, default 60 s).
    now = [1000.0]  # the log's clock, moved by the test

    async def scenario() -> None:
        log = await ProvenanceLog.open(
            tmp_path,
            ORIGIN,
            _signer(),
            settings=LogSettings(group_commit_ms=0, checkpoint_every=1),
            clock=lambda: now[0],
        )
        held = Held(log.store.export)
        monkeypatch.setattr(log.store, "export", held)
        await log_request(log, 0)  # a checkpoint falls due: its export runs long
        await until_async(held.entered.is_set, "the export started", timeout=30.0)
        now[0] += 59.0  # far past the write batch's 5 s
        assert log.export_seconds == 59.0  # the metric shows it all the same
        assert log.last_error is None  # still ready
        now[0] += 1.0
        assert "a checkpoint export has not returned for 60.0 s" in str(log.last_error)
        held.hung = False
        held.release.set()
        await until_async(lambda: log.last_error is None, "the export returned", timeout=30.0)
        await log.close()

    asyncio.run(scenario())
    assert LogSettings().export_stall_after_ms == 60_000.0  # the default
