"""The writer: durable appends, group commit, checkpoints, recovery, write failures."""

from __future__ import annotations

import asyncio
import errno
import itertools
import re
import shutil
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

import gateway.provenance.writer.segment_writer
import gateway.provenance.writer.store
from gateway.provenance import (
    LogCorruptedError,
    LogEntry,
    LogSettings,
    LogUnavailableError,
    LogVerificationError,
    ProvenanceLog,
    RecordError,
    Signer,
    TlogProof,
    open_checkpoint,
    parse_record,
    refusal_record,
    verify_log,
    verify_tlog_proof,
)
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.formats.layout import WAL, list_history
from gateway.provenance.formats.wal import list_segments
from gateway.provenance.testing import EXAMPLE_POLICY, log_refusal, log_request, seeded_signer
from gateway.provenance.writer.store import SignedNote, Snapshot
from tests.helpers.provenance import FailingDisk  # its writes land, then fail (EIO)
from tests.helpers.waiting import until_async

ORIGIN = "gateway.example/log/replica-1"


def _signer() -> Signer:
    return seeded_signer(ORIGIN)


async def _open(path: Path, **settings: float) -> ProvenanceLog:
    return await ProvenanceLog.open(
        path,
        ORIGIN,
        _signer(),
        settings=LogSettings(**settings),  # type: ignore[arg-type]
    )


def test_append_returns_index_and_close_signs_a_final_checkpoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path)
        assert log.latest_checkpoint() is not None  # the empty tree is signed at open
        requests = [await log_request(log, n) for n in range(5)]
        await log_refusal(log, 99)
        assert [r.dispatch.index for r in requests] == [0, 2, 4, 6, 8]
        assert log.size == 11
        await log.close()
        with pytest.raises(LogUnavailableError, match="closed"):
            await log_request(log, 6)

    asyncio.run(scenario())
    summary = verify_log(tmp_path, [_signer().verifier()])
    assert (summary.size, summary.open_dispatches, summary.unsigned_entries) == (11, 0, 0)
    assert list_segments(tmp_path / WAL) == []


def test_concurrent_appends_share_commits(tmp_path: Path) -> None:
    async def scenario() -> int:
        log = await _open(tmp_path, group_commit_ms=5)
        before = log.batches
        await asyncio.gather(*(log_request(log, n) for n in range(32)))
        batches = log.batches - before
        await log.close()
        return batches

    batches = asyncio.run(scenario())
    assert batches < 32  # 64 records, two sequential appends per request
    verify_log(tmp_path, [_signer().verifier()])


def test_a_batch_is_held_open_no_longer_than_a_write_takes(tmp_path: Path) -> None:
    # After a batch of 32 the committer waits for 32 appends again, but never longer than
    # a write takes: with a one-minute window a lone append would otherwise wait a minute.
    async def scenario() -> None:
        log = await _open(tmp_path, group_commit_ms=60_000)
        await log.append(_refusal(0), checked=True)  # a lone appender is committed at once
        await asyncio.gather(*(log.append(_refusal(n), checked=True) for n in range(1, 33)))
        assert log.last_batch > 1
        before = log.batches
        entry = await asyncio.wait_for(log.append(_refusal(33), checked=True), 30)
        assert (entry.index, log.batches - before) == (33, 1)
        assert 0 < log.write_seconds < 30
        await log.close()

    asyncio.run(scenario())


def test_checkpoint_every_n_entries(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path, group_commit_ms=0, checkpoint_every=4)
        for n in range(6):
            await log_request(log, n)
            # Exports run beside the appends: one that is still running when the next
            # falls due delays it (a checkpoint then covers more); wait, to see the cadence.
            await log.exports_idle()
        await log.close()

    asyncio.run(scenario())
    sizes = [size for size, _ in list_history(tmp_path)]
    assert sizes[0] == 0 and sizes[-1] == 12
    assert all(b - a <= 4 for a, b in itertools.pairwise(sizes))


def test_checkpoint_interval_signs_without_more_appends(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path, checkpoint_every=1000, checkpoint_interval_ms=20)
        await log_request(log, 0)
        await until_async(
            lambda: (latest := log.latest_checkpoint()) is not None and latest.checkpoint.size == 2,
            "a checkpoint of size 2",
            timeout=30.0,
        )
        latest = log.latest_checkpoint()
        assert latest is not None and latest.checkpoint.size == 2
        await log.close()

    asyncio.run(scenario())


def test_inclusion_proof_is_a_verifiable_tlog_proof(tmp_path: Path) -> None:
    async def scenario() -> tuple[TlogProof, bytes]:
        log = await _open(tmp_path)
        logged = await asyncio.gather(*(log_request(log, n) for n in range(300)))
        await log.checkpoint()
        proof = await log.inclusion_proof(logged[123].dispatch.index)
        with pytest.raises(ValueError, match="not covered"):
            await log.inclusion_proof(10_000)
        await log.close()
        index = logged[123].dispatch.index
        entry = LogDirectory(tmp_path).bundle(index // 256, 600)[index % 256]
        return proof, entry

    proof, entry = asyncio.run(scenario())
    parsed = TlogProof.parse(proof.format())
    assert parsed == proof
    signed = verify_tlog_proof(parsed, entry, [_signer().verifier()], origin=ORIGIN)
    assert signed.checkpoint.size == 600
    assert parse_record(entry).request_id == "req-123"


def test_invalid_records_are_refused_before_logging(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path)
        with pytest.raises(RecordError, match="unknown field 'prompt'"):
            await log.append({"v": 1, "type": "refusal", "prompt": "secret"})
        with pytest.raises(RecordError, match="record type"):
            await log.append({"type": "other"})
        assert log.size == 0
        await log.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("per_run", [150, 128])  # 128 requests: sizes on tile boundaries
def test_reopen_continues_the_chain_and_checkpoints_stay_consistent(
    tmp_path: Path, per_run: int
) -> None:
    async def run(first: int) -> None:
        log = await _open(tmp_path)
        assert log.size == 2 * first
        await asyncio.gather(*(log_request(log, n) for n in range(first, first + per_run)))
        await log.close()

    for first in (0, per_run, 2 * per_run):
        asyncio.run(run(first))
    summary = verify_log(tmp_path, [_signer().verifier()])
    assert summary.size == 6 * per_run
    records = LogDirectory(tmp_path).find_request(f"req-{per_run + 5}", summary.size)
    assert [r.type for _, r in records] == ["dispatch", "completion"]


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path)
        with pytest.raises(LogUnavailableError, match="already open"):
            await _open(tmp_path)
        await log.close()

    asyncio.run(scenario())


def test_a_directory_of_another_log_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path)
        await log.close()
        with pytest.raises(LogCorruptedError, match="holds the log"):
            await ProvenanceLog.open(tmp_path, "other.example/log", seeded_signer("x"))

    asyncio.run(scenario())


def test_write_failure_raises_then_recovers(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path, group_commit_ms=0)
        await log_request(log, 0)
        await log.checkpoint()  # its snapshot closed the segment: the next append opens one
        wal = tmp_path / WAL
        shutil.rmtree(wal)
        wal.write_bytes(b"")  # a file where the segment directory must be: writes fail
        with pytest.raises(LogUnavailableError, match="cannot append to the provenance log"):
            await log_request(log, 1)
        assert isinstance(log.last_error, LogUnavailableError)
        wal.unlink()
        await log_request(log, 2)
        assert log.last_error is None
        await log.close()

    asyncio.run(scenario())
    summary = verify_log(tmp_path, [_signer().verifier()])
    assert summary.size == 4
    ids = [r.request_id for _, r in LogDirectory(tmp_path).records(4)]
    assert ids == ["req-0", "req-0", "req-2", "req-2"]


def test_after_a_failed_write_the_disk_is_probed_until_it_is_writable(tmp_path: Path) -> None:
    # Without appends (a replica that is not ready gets no traffic) the log still finds
    # out that it can write again; the probe itself appends nothing.
    async def scenario() -> None:
        log = await _open(tmp_path, group_commit_ms=0, probe_interval_ms=10)
        await log_request(log, 0)
        await log.checkpoint()  # its snapshot closed the segment: the next append opens one
        wal = tmp_path / WAL
        shutil.rmtree(wal)
        wal.write_bytes(b"")
        with pytest.raises(LogUnavailableError):
            await log_request(log, 1)
        await asyncio.sleep(0.1)  # several probes, all failing
        assert isinstance(log.last_error, LogUnavailableError)
        wal.unlink()
        await until_async(lambda: log.last_error is None, "a passing probe", timeout=30.0)
        assert log.last_error is None and log.size == 2
        ((_, segment),) = list_segments(wal)
        assert segment.read_bytes() == b""  # the probe's block was cut off again
        await log_request(log, 2)
        await log.close()

    asyncio.run(scenario())
    assert verify_log(tmp_path, [_signer().verifier()]).size == 4


def test_torn_tail_is_cut_and_the_chain_continues(tmp_path: Path) -> None:
    async def write(first: int, count: int) -> None:
        log = await _open(tmp_path, checkpoint_every=10_000, checkpoint_interval_ms=60_000)
        for n in range(first, first + count):
            await log_request(log, n)
        await log.abort()  # as a crash leaves it: no final checkpoint
        del log

    asyncio.run(write(0, 10))
    ((_, segment),) = list_segments(tmp_path / WAL)
    data = segment.read_bytes()
    segment.write_bytes(data + data[:57])  # half a frame: a torn write

    async def reopen() -> None:
        log = await _open(tmp_path)
        assert log.recovery.replayed == 20
        assert log.recovery.torn_bytes == 57
        await log_request(log, 10)
        await log.close()

    asyncio.run(reopen())
    summary = verify_log(tmp_path, [_signer().verifier()])
    assert summary.size == 22


def test_damage_before_the_tail_is_not_cut(tmp_path: Path) -> None:
    async def write() -> None:
        log = await _open(tmp_path, checkpoint_every=10_000, checkpoint_interval_ms=60_000)
        for n in range(3):
            await log_request(log, n)
        await log.abort()

    asyncio.run(write())
    ((_, segment),) = list_segments(tmp_path / WAL)
    (tmp_path / WAL / "00000000000000000099.wal").write_bytes(b"")  # a later segment
    data = bytearray(segment.read_bytes())
    data[40] ^= 0xFF
    segment.write_bytes(bytes(data))

    async def reopen() -> None:
        with pytest.raises(LogCorruptedError):
            await _open(tmp_path)

    asyncio.run(reopen())


def test_checkpoint_notes_are_signed_by_key_and_cosigner(tmp_path: Path) -> None:
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)

    async def scenario() -> None:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, new, cosigners=[old])
        await log_request(log, 0)
        await log.close()

    asyncio.run(scenario())
    note = (tmp_path / "checkpoint").read_bytes()
    assert open_checkpoint(note, [old.verifier()]).checkpoint.size == 2
    assert open_checkpoint(note, [new.verifier()]).checkpoint.size == 2


def test_key_rotation_old_checkpoints_verify_with_the_old_key(tmp_path: Path) -> None:
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)

    async def run(signer: Signer, first: int) -> None:
        # a straight hand-over: the old key listed as retired (the newest checkpoint is its)
        log = await ProvenanceLog.open(tmp_path, ORIGIN, signer, retired=[old.verifier()])
        await log_request(log, first)
        await log.close()

    asyncio.run(run(old, 0))
    asyncio.run(run(new, 1))
    summary = verify_log(tmp_path, [old.verifier(), new.verifier()])
    assert summary.signed_by == tuple(sorted((str(old), str(new))))
    with pytest.raises(LogVerificationError, match=re.escape(f"signed by: {new}")):
        verify_log(tmp_path, [old.verifier()])
    with pytest.raises(LogVerificationError, match=re.escape(f"signed by: {old}")):
        verify_log(tmp_path, [new.verifier()])


def _refusal(number: int) -> dict[str, object]:
    return refusal_record(
        request_id=f"req-{number}",
        time=datetime(2026, 1, 1, tzinfo=UTC),
        tenant="acme",
        model="m",
        policy=EXAMPLE_POLICY,
        trace=[],
        rule="deny",
        reason="policy_denied",
        request_commitment=None,
    )


def test_seals_run_on_the_loop_once_durable_after_their_appenders_woke(tmp_path: Path) -> None:
    seen: list[tuple[bool, int, int]] = []
    order: list[tuple[str, int]] = []

    async def scenario() -> None:
        log = await _open(tmp_path)

        def seal(entry: LogEntry) -> bytes:
            # Durable already: the store counts it before any seal runs.
            seen.append(
                (threading.current_thread() is threading.main_thread(), entry.index, log.store.size)
            )
            order.append(("seal", entry.index))
            return b"sealed-%d" % entry.index

        async def appender(number: int) -> tuple[LogEntry, bytes]:
            entry, sealing = await log.append_sealed(_refusal(number), seal)
            order.append(("woke", entry.index))
            return entry, await sealing

        placed = await asyncio.gather(*(appender(n) for n in range(5)))
        assert [e.index for e, _ in placed] == list(range(5))
        assert [sealed for _, sealed in placed] == [b"sealed-%d" % n for n in range(5)]

        def broken(entry: LogEntry) -> bytes:
            raise RuntimeError("no key")

        entry, sealing = await log.append_sealed(_refusal(5), broken)
        assert (entry.index, log.size) == (5, 6)  # durable even though its seal fails
        with pytest.raises(RuntimeError, match="no key"):
            await sealing
        assert (await log.append(_refusal(6))).index == 6  # a failed seal stops nothing
        await log.close()

    asyncio.run(scenario())
    # On the event loop's thread: no hand-off to a thread and back per batch.
    assert [on_loop for on_loop, _, _ in seen] == [True] * 5
    assert all(size > index for _, index, size in seen)
    # Each appender was woken (its request free to go upstream) before its seal ran.
    for index in range(5):
        assert order.index(("woke", index)) < order.index(("seal", index))
    assert verify_log(tmp_path, [_signer().verifier()]).size == 7


def test_a_queued_sealed_append_outlives_its_cancelled_waiter(tmp_path: Path) -> None:
    """`queue_sealed` (the gateway's dispatch): a waiter cancelled while its entry is on
    its way is not woken until the entry is durable, and can then read that it landed;
    the entry's future is never cancelled and its seal still runs."""

    async def scenario() -> None:
        log = await _open(tmp_path)
        landing, sealing = log.queue_sealed(_refusal(0), lambda entry: b"s%d" % entry.index)

        async def wait() -> LogEntry:
            return await landing

        waiter = asyncio.create_task(wait())
        await asyncio.sleep(0)  # one turn: the waiter's first step, now awaiting `landing`
        assert waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not landing.cancelled()
        assert (landing.result().index, log.size) == (0, 1)  # woken once durable
        assert await sealing == b"s0"
        await log.close()

    asyncio.run(scenario())


def test_appends_go_on_while_a_checkpoint_is_written(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()

    async def scenario() -> None:
        log = await _open(tmp_path, checkpoint_interval_ms=1)
        store = log.store
        export = store.export

        def held_export(snapshot: Snapshot) -> SignedNote:
            started.set()
            release.wait(10)
            return export(snapshot)

        store.export = held_export  # type: ignore[method-assign]
        await log.append(_refusal(0))
        # The checkpoint thread took a snapshot and is held in the export.
        assert await asyncio.to_thread(started.wait, 10)
        placed = [await log.append(_refusal(n)) for n in range(1, 20)]
        assert [e.index for e in placed] == list(range(1, 20))  # none waited for the export
        assert log.latest_checkpoint().checkpoint.size == 0  # type: ignore[union-attr]
        release.set()
        await log.close()

    try:
        asyncio.run(scenario())
    finally:
        release.set()
    summary = verify_log(tmp_path, [_signer().verifier()])
    assert (summary.size, summary.unsigned_entries) == (20, 0)


def test_a_crash_between_snapshot_and_export_replays_every_segment(tmp_path: Path) -> None:
    async def write() -> None:
        log = await _open(tmp_path, checkpoint_every=10_000, checkpoint_interval_ms=60_000)
        store = log.store
        for n in range(3):
            await log_request(log, n)
            store.snapshot()  # rotates the segment; no export follows (as if killed)
        await log.abort()

    asyncio.run(write())
    assert [first for first, _ in list_segments(tmp_path / WAL)] == [0, 2, 4]

    async def reopen() -> None:
        log = await _open(tmp_path)
        assert (log.recovery.replayed, log.size) == (6, 6)
        await log_request(log, 3)
        await log.close()

    asyncio.run(reopen())
    assert list_segments(tmp_path / WAL) == []
    summary = verify_log(tmp_path, [_signer().verifier()])
    assert (summary.size, summary.open_dispatches) == (8, 0)


def test_append_soon_does_not_wait_and_close_flushes_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path, group_commit_ms=50)
        first = log.append_soon(_refusal(0), checked=True)
        assert not first.done()  # queued, not yet durable
        log.append_soon(_refusal(1), checked=True)
        with pytest.raises(RecordError, match="unknown field"):
            log.append_soon({**_refusal(2), "prompt": "secret"})  # checked=False validates
        await log.close()  # flushes what was queued
        assert first.result().index == 0

    asyncio.run(scenario())
    assert verify_log(tmp_path, [_signer().verifier()]).size == 2


def test_unawaited_records_ride_with_the_next_awaited_batch(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path, deferred_flush_ms=60_000)
        first = log.append_soon(_refusal(0), checked=True)
        await asyncio.sleep(0.05)
        assert not first.done()  # nobody waits on it: it does not start a commit
        before = log.batches
        entry = await log.append(_refusal(1), checked=True)
        assert (first.result().index, entry.index, log.batches - before) == (0, 1, 1)
        await log.close()

    asyncio.run(scenario())


def test_unawaited_records_are_written_within_the_deferred_flush(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await _open(tmp_path, deferred_flush_ms=20)
        written = log.append_soon(_refusal(0), checked=True)
        entry = await asyncio.wait_for(written, 5)  # bounded: ~20 ms expected
        assert (entry.index, log.size) == (0, 1)
        await log.close()

    asyncio.run(scenario())


def test_a_failed_checkpoint_is_covered_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(files: object, *, root: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario() -> None:
        log = await _open(tmp_path, checkpoint_interval_ms=20)
        await log.append(_refusal(0))
        with monkeypatch.context() as patched:
            patched.setattr(gateway.provenance.writer.store, "write_files_atomically", full_disk)
            with pytest.raises(LogUnavailableError, match="No space left"):
                await log.checkpoint()
        await until_async(  # the interval's export signs entry 0
            lambda: (latest := log.latest_checkpoint()) is not None and latest.checkpoint.size == 1,
            "a checkpoint of size 1",
            timeout=30.0,
        )
        assert log.latest_checkpoint().checkpoint.size == 1  # type: ignore[union-attr]
        await log.close()

    asyncio.run(scenario())
    assert verify_log(tmp_path, [_signer().verifier()]).size == 1


def test_writes_that_land_but_fail_leave_no_junk_before_a_later_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failed append or probe may leave bytes after the valid frames; a snapshot must not
    # close that segment with them, or the next open finds a damaged segment that is not
    # the last (found by review: probes left 4 KiB of zeros there, and the log refused
    # to open).
    disk = FailingDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)

    def broken(files: object, *, root: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def scenario() -> None:
        log = await _open(tmp_path, group_commit_ms=0, probe_interval_ms=10)
        await log_request(log, 0)
        disk.failing = True
        with pytest.raises(LogUnavailableError, match="Input/output error"):
            await log_request(log, 1)
        await asyncio.sleep(0.1)  # failing probes
        with monkeypatch.context() as patched:
            patched.setattr(gateway.provenance.writer.store, "write_files_atomically", broken)
            with pytest.raises(LogUnavailableError):
                await log.checkpoint()
        await asyncio.sleep(0.1)
        await log.abort()  # as a crash leaves it
        disk.failing = False

    asyncio.run(scenario())

    async def reopen() -> None:
        log = await _open(tmp_path)
        assert log.size == 2  # request 0's two records; nothing of request 1
        await log_request(log, 2)
        await log.close()

    asyncio.run(reopen())
    assert verify_log(tmp_path, [_signer().verifier()]).size == 4


def test_a_checkpoint_whose_clean_up_failed_leaves_the_log_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The checkpoint is durable; leftover segments are harmless and the next export
    # deletes them. Counting the failure as the log's error kept a replica not ready with
    # no traffic to clear it (found by review).
    real = gateway.provenance.writer.store.LogStore.clean_up
    failures = [LogUnavailableError("cannot clean up the provenance log: Permission denied")]

    def cleanup(store: object, completed: list[str], covered: int | None) -> None:
        if covered and failures:
            raise failures.pop()
        real(store, completed, covered)  # type: ignore[arg-type]

    monkeypatch.setattr(gateway.provenance.writer.store.LogStore, "clean_up", cleanup)

    async def scenario() -> None:
        log = await _open(tmp_path, group_commit_ms=0)
        await log_request(log, 0)
        await log.checkpoint()
        assert log.last_error is None
        assert log.cleanup_error is not None
        assert list_segments(tmp_path / WAL)  # left over
        await log_request(log, 1)
        await log.checkpoint()
        assert log.cleanup_error is None
        assert list_segments(tmp_path / WAL) == []  # the next export deleted them
        await log.close()

    asyncio.run(scenario())
    assert verify_log(tmp_path, [_signer().verifier()]).size == 4


def test_a_cancelled_close_still_signs_and_releases_and_a_second_close_waits(
    tmp_path: Path,
) -> None:
    # Found by review: a caller of close() cancelled while the committer drained left the
    # final checkpoint unsigned and the directory locked, and a second close() returned
    # at once.
    async def scenario() -> None:
        log = await _open(tmp_path)
        await log_request(log, 0)
        closing = asyncio.ensure_future(log.close())
        await asyncio.sleep(0)  # the stop has begun
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        await log.close()  # waits for the first stop to end
        assert log.latest_checkpoint().checkpoint.size == 2  # type: ignore[union-attr]

    asyncio.run(scenario())
    assert verify_log(tmp_path, [_signer().verifier()]).unsigned_entries == 0

    async def reopen() -> None:  # the directory was released
        log = await _open(tmp_path)
        assert log.size == 2
        await log.close()

    asyncio.run(reopen())


def test_records_nobody_waits_on_are_written_once_the_disk_takes_writes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 12, item 14: a completion whose write failed was lost (only logged), leaving
    # its dispatch open in the log for good although the disk came back moments later.
    disk = FailingDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)

    async def scenario() -> None:
        log = await _open(tmp_path, group_commit_ms=0, deferred_flush_ms=0, probe_interval_ms=10)
        await log.append(_refusal(0), checked=True)
        disk.failing = True
        soon = log.append_soon(_refusal(1), checked=True)
        await until_async(lambda: log.last_error is not None, "a refused write", interval=0.005)
        assert not soon.done()  # kept, not failed
        with pytest.raises(LogUnavailableError):  # awaited appends still fail at once
            await log.append(_refusal(2), checked=True)
        disk.failing = False  # the disk is back: the next probe writes it
        entry = await asyncio.wait_for(soon, 10)
        assert (entry.index, log.size, log.last_error) == (1, 2, None)
        await log.close()

    asyncio.run(scenario())
    summary = verify_log(tmp_path, [_signer().verifier()])
    assert summary.size == 2
    records = [r.request_id for _, r in LogDirectory(tmp_path).records(summary.size)]
    assert records == ["req-0", "req-1"]  # nothing of the refused awaited append


def test_records_kept_after_a_failed_write_are_bounded_and_fail_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FailingDisk()
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)

    async def scenario() -> None:
        log = await _open(
            tmp_path,
            group_commit_ms=0,
            deferred_flush_ms=0,
            probe_interval_ms=60_000,
            max_retained=2,
        )
        disk.failing = True
        kept = [log.append_soon(_refusal(n), checked=True) for n in range(3)]
        await asyncio.sleep(0)  # queued before the committer's round
        # One failed batch of three, with room to keep two: the oldest fails at once.
        await until_async(kept[0].done, "the oldest failed", interval=0.005)
        assert isinstance(kept[0].exception(), LogUnavailableError)
        assert not kept[1].done() and not kept[2].done()
        await log.close()  # their last try: the disk still refuses them
        for future in kept[1:]:
            assert isinstance(future.exception(), LogUnavailableError)
        disk.failing = False

    asyncio.run(scenario())
    assert verify_log(tmp_path, [_signer().verifier()]).size == 0


@pytest.mark.parametrize(
    "setting",
    [
        "group_commit_ms",
        "deferred_flush_ms",
        "checkpoint_interval_ms",
        "probe_interval_ms",
        "stall_after_ms",
    ],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_the_cadence_must_be_finite(setting: str, value: float) -> None:
    """NaN passed every `< 0` check: with a NaN checkpoint interval the committer computed
    a sleep of 0 forever once an entry was unsigned, and the event loop never ran again."""
    with pytest.raises(ValueError, match="finite"):
        LogSettings(**{setting: value})  # type: ignore[arg-type]
