"""The writer under faults it must survive or refuse: a log directory deleted or replaced
while the log is open, a snapshot or signer that raises, a committer that stops, and the
one line each fault and its end are reported with (docs/provenance.md, "Failures")."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import gateway.provenance.writer.segment_writer
import gateway.provenance.writer.store
from gateway.provenance import (
    LogSettings,
    LogUnavailableError,
    ProvenanceLog,
    Signer,
    refusal_record,
    verify_log,
)
from gateway.provenance.formats.layout import CHECKPOINT
from gateway.provenance.testing import EXAMPLE_POLICY, log_refusal, log_request, seeded_signer
from gateway.provenance.writer.store import LogStore
from tests.helpers.provenance import (
    FailingDisk,  # its writes land, then fail (EIO)
    Held,  # a store method on a log thread, hung until released
)
from tests.helpers.waiting import until_async

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


def _failing_disk(monkeypatch: pytest.MonkeyPatch) -> FailingDisk:
    """The write-ahead segment's `os`: its writes land, then fail (EIO) while `failing`."""
    disk = FailingDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)
    return disk


def _fill_disk(patch: pytest.MonkeyPatch) -> None:
    """Every checkpoint export from here on fails: the disk is full (ENOSPC)."""

    def full_disk(files: object, *, root: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    patch.setattr(gateway.provenance.writer.store, "write_files_atomically", full_disk)


async def _open_probing(path: Path, events: Events) -> ProvenanceLog:
    """A log that commits each append on its own, probes a fault and falls due for a
    checkpoint every 10 ms, reporting to `events`."""
    return await _open(
        path, events, group_commit_ms=0, probe_interval_ms=10, checkpoint_interval_ms=10
    )


# Each fault reported once when it begins and once when it ends: an append's, a checkpoint's.
FAULTS_BEGUN_AND_ENDED = [
    ("error", "provenance log not writable"),
    ("info", "provenance log writable again"),
    ("error", "provenance checkpoint not signed"),
    ("info", "provenance checkpoints signed again"),
]


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
        loop, probed, three = asyncio.get_running_loop(), [0], asyncio.Event()
        probe = log._store.probe

        def counted() -> None:  # runs in the log's worker thread
            try:
                probe()
            finally:
                probed[0] += 1
                if probed[0] == 3:
                    loop.call_soon_threadsafe(three.set)

        log._store.probe = counted  # type: ignore[method-assign]
        # Three probes since the new directory appeared, each failing.
        await asyncio.wait_for(three.wait(), timeout=30)
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


def test_a_snapshot_that_raises_does_not_stop_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: any error but a ProvenanceError ended the committer task; every later
    # append was refused ("closed") while `last_error` said the log was fine.
    real = LogStore.snapshot
    raised: list[bool] = []

    def snapshot(store: LogStore) -> object:
        if not raised:
            raised.append(True)
            raise RuntimeError("snapshot broke")
        return real(store)

    async def scenario() -> None:
        log = await _open(
            tmp_path, group_commit_ms=0, checkpoint_interval_ms=10, probe_interval_ms=10
        )
        monkeypatch.setattr(LogStore, "snapshot", snapshot)  # opening took one already
        await log_request(log, 0)
        await until_async(lambda: bool(raised), "the failing snapshot", timeout=30.0)
        await until_async(lambda: log.last_error is None, "a passing probe", timeout=30.0)
        await log_request(log, 1)
        await log.close()

    asyncio.run(scenario())
    assert verify_log(tmp_path, [_signer().verifier()]).size == 4


def test_a_committer_that_stopped_is_reported_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: ProvenanceLog) -> None:
        raise RuntimeError("a bug in the committer")

    monkeypatch.setattr(ProvenanceLog, "_gather_batch", broken)

    async def scenario() -> None:
        log = await _open(tmp_path)
        with pytest.raises(LogUnavailableError):
            await log_request(log, 0)
        assert log.last_error is not None
        assert "writer stopped" in str(log.last_error)
        await log.abort()

    asyncio.run(scenario())


def test_a_final_checkpoint_the_signer_fails_is_the_log_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `owngate serve` reports a LogUnavailableError from close() and exits 4; another
    # exception escaped it (the shutdown then neither said so nor exited 4).
    def signer_down(*args: object) -> bytes:
        raise RuntimeError("signer down")

    async def scenario() -> None:
        log = await _open(tmp_path, checkpoint_interval_ms=3_600_000)
        await log_request(log, 0)
        monkeypatch.setattr(gateway.provenance.writer.store, "sign_checkpoint", signer_down)
        with pytest.raises(LogUnavailableError, match="signer down"):
            await log.close()

    asyncio.run(scenario())
    monkeypatch.undo()

    async def reopen() -> None:  # the entries stayed in the write-ahead segment
        log = await _open(tmp_path)
        assert log.size == 2
        await log.close()

    asyncio.run(reopen())
    assert verify_log(tmp_path, [_signer().verifier()]).size == 2


def test_a_fault_is_reported_once_when_it_begins_and_once_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _failing_disk(monkeypatch)
    events = Events()
    failing_exports = 3

    async def scenario() -> None:
        log = await _open_probing(tmp_path, events)
        await log_request(log, 0)
        disk.failing = True
        for number in range(1, 4):  # three refused appends, and probes between them
            with pytest.raises(LogUnavailableError, match="Input/output error"):
                await log_request(log, number)
        disk.failing = False
        await until_async(lambda: log.last_error is None, "a passing probe", timeout=30.0)
        with monkeypatch.context() as patched:
            _fill_disk(patched)
            for number in range(4, 4 + failing_exports):  # each one falls due and fails
                await log_request(log, number)
                await until_async(
                    lambda: log.last_error is not None, "a failed checkpoint", timeout=30.0
                )
                await log.exports_idle()
        await until_async(lambda: log.last_error is None, "a signed checkpoint", timeout=30.0)
        await log.close()

    asyncio.run(scenario())
    assert events.events() == FAULTS_BEGUN_AND_ENDED
    not_writable, _, not_signed, _ = (fields for _, _, fields in events.lines)
    assert "Input/output error" in not_writable["detail"]
    assert "No space left on device" in not_signed["detail"]
    assert (tmp_path / CHECKPOINT).is_file()
    assert verify_log(tmp_path, [_signer().verifier()]).size == 2 * (1 + failing_exports)


class HungDisk:
    """`os` for the write-ahead segment: a write blocks while `hung` is set (a hung disk
    or network mount), until `release` is (bounded: 60 s)."""

    def __init__(self) -> None:
        self.hung = False
        self.release = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if self.hung:
            self.release.wait(60)
        return os.pwrite(fd, data, offset)


def test_a_write_that_does_not_return_is_a_fault_and_new_appends_fail_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: requests waited on their dispatch record for as long as the disk hung
    # (bounded only by their clients), and the log said it was writable all along.
    disk = HungDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)
    events = Events()

    async def scenario() -> None:
        log = await _open(tmp_path, events, group_commit_ms=0)  # stall_after_ms: 5000
        await log_request(log, 0)
        disk.hung = True
        stuck = asyncio.ensure_future(log_refusal(log, 1))
        await until_async(lambda: log.last_error is not None, "a stalled write", timeout=30.0)
        assert "has not returned" in str(log.last_error)
        with pytest.raises(LogUnavailableError, match="has not returned"):
            await log_refusal(log, 2)  # refused at once, not queued behind the hung write
        completion = log.append_soon(
            refusal_record(
                request_id="req-3",
                time=datetime(2026, 1, 1, tzinfo=UTC),
                tenant="acme",
                model="m",
                policy=EXAMPLE_POLICY,
                trace=[],
                rule="deny",
                reason="policy_denied",
                request_commitment=None,
            )
        )  # a record nobody waits on still queues: it lands once the disk is back
        disk.hung = False
        disk.release.set()
        assert (await stuck).index == 2  # the write that hung landed
        assert (await completion).index == 3
        assert log.last_error is None
        await log.close()

    asyncio.run(scenario())
    assert events.events() == [
        ("error", "provenance log not writable"),
        ("info", "provenance log writable again"),
    ]
    assert verify_log(tmp_path, [_signer().verifier()]).size == 4


def test_a_snapshot_that_does_not_return_is_a_stalled_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The snapshot closes the segment on the writer thread: hung, it held every append
    # back while the log said it was writable; now new appends are refused at once.
    events = Events()

    async def scenario() -> None:
        log = await _open(
            tmp_path, events, group_commit_ms=0, checkpoint_interval_ms=1, stall_after_ms=200
        )
        held = Held(log.store.snapshot)
        held.hung = False
        monkeypatch.setattr(log.store, "snapshot", held)
        await log_request(log, 0)
        held.hung = True
        await log_refusal(log, 1)  # then a checkpoint falls due: its snapshot hangs
        await until_async(held.entered.is_set, "the snapshot started", timeout=30.0)
        await until_async(
            lambda: "a write has not returned" in str(log.last_error),
            "a stalled snapshot",
            timeout=30.0,
        )
        with pytest.raises(LogUnavailableError, match="a write has not returned"):
            await log_refusal(log, 2)  # refused at once, not queued behind the snapshot
        held.hung = False
        held.release.set()
        await until_async(lambda: log.last_error is None, "the snapshot returned", timeout=30.0)
        await log_refusal(log, 3)
        await log.close()

    asyncio.run(scenario())
    writable = [line for line in events.events() if "log" in line[1] and "writable" in line[1]]
    assert writable == [
        ("error", "provenance log not writable"),
        ("info", "provenance log writable again"),
    ]
    assert verify_log(tmp_path, [_signer().verifier()]).size == 4


class UnwritableEvents(Events):
    """A reporter whose lines cannot be written: the gateway's stderr on the disk that
    just filled up (EFBIG, ENOSPC), as structlog's print raises it."""

    def error(self, event: str, **fields: Any) -> None:
        super().error(event, **fields)
        raise OSError(errno.EFBIG, "File too large")

    def info(self, event: str, **fields: Any) -> None:
        super().info(event, **fields)
        raise OSError(errno.EFBIG, "File too large")


def test_a_fault_line_that_cannot_be_written_neither_hangs_nor_hides_the_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk that refuses the log also takes the process's stderr: reporting the fault
    # raises. The refused appenders must still get their error (not wait for ever), the
    # fault must still show (`last_error`), and the log must go on once the disk is back.
    disk = _failing_disk(monkeypatch)
    events = UnwritableEvents()

    async def scenario() -> None:
        log = await _open_probing(tmp_path, events)
        await log_request(log, 0)
        disk.failing = True
        for number in (1, 2):  # bounded: a hang fails the test instead of stalling it
            with pytest.raises(LogUnavailableError, match="Input/output error"):
                await asyncio.wait_for(log_request(log, number), timeout=30)
            assert log.last_error is not None
        disk.failing = False
        await until_async(lambda: log.last_error is None, "a passing probe", timeout=30.0)
        await asyncio.wait_for(log_request(log, 3), timeout=30)
        with monkeypatch.context() as patched:
            _fill_disk(patched)
            await asyncio.wait_for(log_request(log, 4), timeout=30)
            await until_async(
                lambda: log.last_error is not None, "a failed checkpoint shown", timeout=30.0
            )
            await log.exports_idle()
        await until_async(lambda: log.last_error is None, "a signed checkpoint", timeout=30.0)
        await asyncio.wait_for(log.close(), timeout=30)

    asyncio.run(scenario())
    assert events.events() == FAULTS_BEGUN_AND_ENDED
    assert verify_log(tmp_path, [_signer().verifier()]).size == 2 * 3  # requests 0, 3 and 4
