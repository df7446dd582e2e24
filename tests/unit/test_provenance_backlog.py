"""The entries the log holds until a signed checkpoint covers them, while its checkpoints
fail or hang and its write-ahead segment still takes appends: bounded by
`LogSettings.max_unsigned_bytes`, awaited appends refused past it (completions still
written), the log not ready and the fault reported once; all of it signed, in order, once a
checkpoint can be written again (docs/provenance.md, "Failures";
gateway/provenance/writer/backlog.py). Each refusal is an exception of its own.
"""

from __future__ import annotations

import asyncio
import errno
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import gateway.provenance.writer.store
from gateway.config.provenance import ProvenanceSettings
from gateway.provenance import (
    LogSettings,
    LogUnavailableError,
    ProvenanceLog,
    refusal_record,
    verify_log,
)
from gateway.provenance.testing import EXAMPLE_POLICY, log_refusal, log_request, seeded_signer
from tests.helpers.provenance import Held
from tests.helpers.waiting import until_async

ORIGIN = "gateway.example/log/backlog"
BOUND = 16 * 1024  # bytes of unsigned entries: some 20 requests' records


class Events:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def error(self, event: str, **fields: Any) -> None:
        self.lines.append(("error", event))

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append(("info", event))


async def _open(
    path: Path, events: Events, bound: int | None = BOUND, **settings: Any
) -> ProvenanceLog:
    """A log with a checkpoint due every 10 ms; `bound`: its `max_unsigned_bytes` (None:
    the default)."""
    settings |= {} if bound is None else {"max_unsigned_bytes": bound}
    return await ProvenanceLog.open(
        path,
        ORIGIN,
        seeded_signer(ORIGIN),
        settings=LogSettings(group_commit_ms=0, checkpoint_interval_ms=10, **settings),
        events=events,
    )


def _full_disk(files: object, *, root: Path) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _failing_signer(checkpoint: object, signers: object) -> bytes:
    raise RuntimeError("the signing service is down")


# What makes every checkpoint export fail: the tiles' disk, or the signer.
FAULTS = {
    "full-disk": ("write_files_atomically", _full_disk),
    "signer-raising": ("sign_checkpoint", _failing_signer),
}


async def _fill(log: ProvenanceLog) -> int:
    """Log refusals until the log refuses one (at most 1,000); returns those logged."""
    for number in range(1000):
        try:
            await log_refusal(log, number)
        except LogUnavailableError as exc:
            if "provenance.max_unsigned_bytes" not in str(exc):
                raise
            return number
    raise AssertionError("1,000 requests logged while no checkpoint could be written")


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_entries_no_checkpoint_can_cover_are_bounded_and_all_signed_once_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    events = Events()

    async def scenario() -> int:
        log = await _open(tmp_path, events)
        await log_request(log, 0)
        await until_async(lambda: log.latest_checkpoint().checkpoint.size == 2, "signed")  # type: ignore[union-attr]
        with monkeypatch.context() as patched:  # checkpoints fail; the segment takes appends
            patched.setattr(gateway.provenance.writer.store, *FAULTS[fault])
            logged = await _fill(log)
            held, bound = log.unsigned_bytes
            assert bound == BOUND
            # Refused at the bound: what is held passes it by one request's records at most.
            assert BOUND <= held < BOUND + 2048, held
            assert log.last_error is not None  # not ready
            assert log.latest_checkpoint().checkpoint.size == 2  # type: ignore[union-attr]
            # A record nobody waits on (a served request's completion) is still written.
            await asyncio.wait_for(log.append_soon(_refusal(logged)), 30)
            with pytest.raises(LogUnavailableError, match="max_unsigned_bytes"):
                await log_refusal(log, logged + 1)
            size = log.size
        # The disk takes tiles again: the next checkpoint signs every entry held.
        await until_async(  # the export's end is seen on the loop after its checkpoint
            lambda: log.latest_checkpoint().checkpoint.size == size and log.last_error is None,  # type: ignore[union-attr]
            "every entry held signed",
            timeout=30.0,
        )
        assert log.unsigned_bytes[0] == 0
        await log_request(log, 999)  # taken again
        await log.close()
        return size + 2  # request 999's two records

    size = asyncio.run(scenario())
    assert verify_log(tmp_path, [seeded_signer(ORIGIN).verifier()]).size == size
    full = ("error", "provenance log backlog full")
    assert events.lines.count(full) == 1, events.lines
    assert events.lines.count(("info", "provenance log backlog signed again")) == 1


def _refusal(number: int) -> dict[str, object]:
    return refusal_record(
        request_id=f"req-{number}",
        time=datetime(2026, 1, 1, tzinfo=UTC),
        tenant="acme-app",
        model="m",
        policy=EXAMPLE_POLICY,
        trace=[],
        rule="hosted.deny",
        reason="policy hosted.deny",
        request_commitment=None,
    )


def test_a_hung_export_holds_no_more_than_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An export that does not return (a stuck fsync on the tiles' disk): no snapshot is
    # taken meanwhile, so every entry appended waited in memory until it returned.
    events = Events()

    async def scenario() -> None:
        log = await _open(tmp_path, events)
        held = Held(log.store.export)
        monkeypatch.setattr(log.store, "export", held)
        await log_request(log, 0)
        await asyncio.to_thread(held.entered.wait, 30)  # the export of request 0 hangs
        await _fill(log)
        assert BOUND <= log.unsigned_bytes[0] < BOUND + 2048
        assert log.last_error is not None
        held.hung = False
        held.release.set()
        size = log.size
        await until_async(
            lambda: log.latest_checkpoint().checkpoint.size == size and log.last_error is None,  # type: ignore[union-attr]
            "every entry held signed",
            timeout=30.0,
        )
        await log.close()

    asyncio.run(scenario())
    verify_log(tmp_path, [seeded_signer(ORIGIN).verifier()])


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_unsigned_bytes"):
        LogSettings(max_unsigned_bytes=0)


@pytest.mark.parametrize("bound", [1, 65_535])
def test_a_config_bound_that_holds_too_few_records_is_refused(bound: int) -> None:
    # 1 byte refused nearly every request between two checkpoints, with no fault at all.
    with pytest.raises(ValidationError, match="max_unsigned_bytes"):
        ProvenanceSettings(
            dir="log", origin="gw.example/log", signing_key_file="k", max_unsigned_bytes=bound
        )
    assert (
        ProvenanceSettings(
            dir="log", origin="gw.example/log", signing_key_file="k", max_unsigned_bytes=65_536
        ).max_unsigned_bytes
        == 65_536
    )


def _frames(error: BaseException) -> int:
    count, tb = 0, error.__traceback__
    while tb is not None:
        count, tb = count + 1, tb.tb_next
    return count


async def _refusals(log: ProvenanceLog, first: int, count: int) -> list[LogUnavailableError]:
    refused = []
    for number in range(first, first + count):
        with pytest.raises(LogUnavailableError) as caught:
            await log_refusal(log, number)
        refused.append(caught.value)
    return refused


def _distinct(refused: list[LogUnavailableError]) -> None:
    assert len({id(error) for error in refused}) == len(refused)
    assert len({_frames(error) for error in refused}) == 1, [_frames(e) for e in refused]


def test_each_append_a_stalled_write_refuses_gets_an_error_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The log refused every awaited append while a write hung with one shared exception:
    # each raise chained its traceback onto it, so every refused request's frames, and
    # all they held, stayed in memory while the fault lasted (a real gateway grew by some
    # 12 MB in 2,000 refused requests).
    events = Events()

    async def scenario() -> None:
        log = await _open(tmp_path, events, None, stall_after_ms=50)
        await log_request(log, 0)
        hung = Held(log.store.append_frames)
        monkeypatch.setattr(log.store, "append_frames", hung)
        stuck = asyncio.ensure_future(log_refusal(log, 1))
        await asyncio.to_thread(hung.entered.wait, 30)
        await until_async(lambda: log.last_error is not None, "a stalled write", timeout=30.0)
        refused = await _refusals(log, 2, 5)
        hung.hung = False
        hung.release.set()
        await stuck
        await log.close()
        _distinct(refused)

    asyncio.run(scenario())


def test_each_append_a_full_backlog_refuses_gets_an_error_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = Events()

    async def scenario() -> None:
        log = await _open(tmp_path, events)
        with monkeypatch.context() as patched:
            patched.setattr(gateway.provenance.writer.store, "write_files_atomically", _full_disk)
            refused = await _refusals(log, await _fill(log) + 1, 5)
        await until_async(lambda: log.last_error is None, "signed again", timeout=30.0)
        await log.close()
        _distinct(refused)

    asyncio.run(scenario())
