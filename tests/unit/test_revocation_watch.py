"""The running watch of this host's revoked keys list (revocation_keeper.py) on a host
that misbehaves: a look that never ends (a hung filesystem) counts the list damaged
within its bound instead of holding the watch for good; a list the host could not open
for want of descriptors (`EMFILE`) keeps the last good one instead of refusing every
request; a list that lost digests it held (an older copy restored) gets them written
back, and the process never drops one."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway import small_files
from gateway.state import MemoryState, RevocationListError, revocation_keeper, revocation_list
from gateway.state.revocation_keeper import KeptRevocations
from gateway.state.revocation_list import add_revocations, read_revocations, render_revocations
from tests.helpers.waiting import until_async

HANG_BOUND_S = 30.0  # bounds a look that hangs before the fix; never reached after it


def digest(n: int) -> str:
    return "sha256:" + hashlib.sha256(str(n).encode()).hexdigest()


class HungReads:
    """`read_revocations` as on a hard NFS mount gone away: once `hang` is set, each
    read blocks until `release` is; `calls` counts the reads begun since."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()
        self.calls = 0
        self._read = read_revocations

    def __call__(self, path: Path) -> frozenset[str]:
        if self.hang.is_set():
            self.calls += 1
            self.release.wait()
            try:
                return self._read(path)
            finally:
                self.returned.set()
        return self._read(path)


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Iterator[HungReads]:
    reads = HungReads()
    monkeypatch.setattr(revocation_keeper, "read_revocations", reads)
    yield reads
    reads.release.set()  # whatever the test did: no thread left waiting


def test_a_look_that_never_ends_counts_the_list_damaged(
    tmp_path: Path, hung: HungReads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `look` waited on the read for good: the watch stalled, what was revoked
    later was never enforced, and `damaged` stayed None (requests served)."""
    path = tmp_path / "revoked-keys"
    add_revocations(path, [digest(1)])
    monkeypatch.setattr(revocation_keeper, "LOOK_LIMIT_S", 0.2, raising=False)
    kept = KeptRevocations(path)

    async def scenario() -> None:
        try:
            await hung_then_released()
        finally:
            hung.release.set()  # before: frees the look's thread, so the loop can close
            await kept.close()

    async def hung_then_released() -> None:
        hung.hang.set()
        add_revocations(path, [digest(2)])  # changed: the next look reads it, and hangs
        assert await asyncio.wait_for(kept.look(), HANG_BOUND_S) == frozenset()
        assert kept.damaged is not None and "has not ended within 0.2 s" in kept.damaged
        assert await asyncio.wait_for(kept.look(), HANG_BOUND_S) == frozenset()
        assert hung.calls == 1  # the next look waits for the same read: no thread piles up
        hung.release.set()
        await asyncio.to_thread(hung.returned.wait, HANG_BOUND_S)
        await until_async(lambda: kept._reading is None or kept._reading.done(), "settled")
        assert await kept.look() == {digest(2)}  # the read that hung, taken once it ended
        assert kept.damaged is None

    with capture_logs() as logs:
        asyncio.run(scenario())
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == [
        "revoked keys list look has not ended; refusing every tenant request until one "
        "does (the filesystem holding it may hang)"
    ]  # once; never the advice to restore a list that is fine


def test_a_list_the_host_cannot_open_now_keeps_the_last_good_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`EMFILE` on opening the list: the last good list stays enforced (never less), the
    errno is logged once and the list read again at each look; only when that lasts the
    look limit is it damaged, said as the host's want. Before, the first such look set
    `damaged`: every tenant request refused, the log telling the operator to restore it."""
    path = tmp_path / "revoked-keys"
    add_revocations(path, [digest(1)])
    now = [0.0]
    monkeypatch.setattr(revocation_keeper, "LOOK_LIMIT_S", 5.0, raising=False)  # as made
    kept = KeptRevocations(path, clock=lambda: now[0])
    state = MemoryState(kept=kept)
    real = small_files.read_small_file
    failing = [True]

    def out_of_descriptors(where: Path, limit: int) -> bytes:
        if failing[0]:
            raise OSError(errno.EMFILE, "Too many open files", str(where))
        return real(where, limit)

    monkeypatch.setattr(revocation_list, "read_small_file", out_of_descriptors)

    async def scenario() -> None:
        os.replace(_staged(path, [digest(1), digest(2)]), path)  # changed: read at the look
        assert await kept.look() == frozenset()
        assert kept.damaged is None  # before: "cannot be read: Too many open files"
        assert state.is_revoked(digest(1))  # the last good list, enforced
        now[0] = 4.9
        assert await kept.look() == frozenset() and kept.damaged is None
        now[0] = 5.0  # lasted the look limit: damaged, and said why
        assert await kept.look() == frozenset()
        assert kept.damaged is not None and "cannot be opened now (EMFILE)" in kept.damaged
        failing[0] = False
        assert await kept.look() == {digest(2)}
        assert kept.damaged is None and state.is_revoked(digest(2))
        await kept.close()

    with capture_logs() as logs:
        asyncio.run(scenario())
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert [e.get("errno") for e in warned] == ["EMFILE"]  # once, with its class
    errors = [e["event"] for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1 and "out of file descriptors" in errors[0], errors
    assert not any("restore" in e["event"] for e in logs)


def test_a_state_not_built_for_want_of_descriptors_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "revoked-keys"
    add_revocations(path, [digest(1)])

    def out_of_descriptors(where: Path, limit: int) -> bytes:
        raise OSError(errno.ENFILE, "Too many open files in system", str(where))

    monkeypatch.setattr(revocation_list, "read_small_file", out_of_descriptors)
    with pytest.raises(RevocationListError, match=r"\(ENFILE\).*out of file descriptors"):
        KeptRevocations(path)


def test_a_list_rolled_back_gets_what_it_lost_written_back(tmp_path: Path) -> None:
    """An older copy of the list restored over it while the process runs: the digests it
    lacks stay refused here (as before) and are written back within a look, logged as an
    error and counted. Before, they were never written back: a process started here next
    (a worker started again, a restart while Redis is down) served those keys again."""
    path = tmp_path / "revoked-keys"
    add_revocations(path, [digest(1)])
    backup = path.read_bytes()
    add_revocations(path, [digest(2), digest(3)])
    kept = KeptRevocations(path, watch_s=0.01)
    state = MemoryState(kept=kept)

    async def scenario() -> None:
        await state.start()
        try:
            await state.revoke_key(digest(4))  # made here: on the list, then lost too
            staged = path.with_name("restored")
            staged.write_bytes(backup)
            os.replace(staged, path)  # the backup restored, renamed over it
            await until_async(
                lambda: (
                    state.status().unlisted_revocations == 0
                    and read_revocations(path) == {digest(n) for n in (1, 2, 3, 4)}
                ),
                "what the list lost written back (its write ended)",
            )
            assert all(state.is_revoked(digest(n)) for n in (1, 2, 3, 4))
            assert state.status().revocations_list_rollbacks == 1
            assert state.status().revocations_list_error is None  # served meanwhile
        finally:
            await state.close()

    with capture_logs() as logs:
        asyncio.run(scenario())
    lost = [e for e in logs if e["log_level"] == "error"]
    assert [e.get("lost") for e in lost] == [3], lost
    assert "an older copy restored" in lost[0]["event"]
    assert MemoryState(kept=KeptRevocations(path)).is_revoked(digest(2))  # the next start


def _staged(path: Path, digests: list[str]) -> Path:
    staged = path.with_name("staged")
    staged.write_bytes(render_revocations(digests))
    return staged


def test_a_write_that_never_ends_holds_no_revocation_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list's write blocks for good (a hung filesystem whose `stat` a cache still
    answers: the looks go on). A revocation learned from Redis is handed to `listed`
    (enforced) once its write ends: before, it never was, and the key stayed served here
    while every other replica refused it. Now a write not ended within its lock wait and
    the look limit counts as failed for what it holds back, and so does each revocation
    noted while it hangs; the write, once it ends, still lands on the list."""
    path = tmp_path / "revoked-keys"
    release, began = threading.Event(), threading.Event()
    write = add_revocations

    def hung(where: Path, digests: set[str], *, wait_s: float) -> int:
        began.set()
        release.wait()
        return write(where, digests, wait_s=wait_s)

    monkeypatch.setattr(revocation_keeper, "add_revocations", hung)
    kept = KeptRevocations(path, lock_wait_s=0.1, look_limit_s=0.1)
    listed: set[str] = set()
    kept.listed = listed.update

    async def scenario() -> None:
        try:
            kept.note([digest(1)])  # learned from Redis: enforced once its write ends
            kept.flush_soon()
            await asyncio.to_thread(began.wait, HANG_BOUND_S)
            await until_async(lambda: digest(1) in listed, "refused though its write hangs")
            kept.note([digest(2)])  # learned while it hangs: at once
            assert digest(2) in listed and kept.unwritten == 2
        finally:
            release.set()  # before: frees the write, so the loop can close
            await kept.close()

    with capture_logs() as logs:
        asyncio.run(scenario())
    assert read_revocations(path) == {digest(1), digest(2)}  # written once it ended
    assert kept.unwritten == 0
    errors = [e["event"] for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1 and "write has not ended" in errors[0], errors


def test_a_rollback_while_a_look_is_under_way_is_still_written_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look's `stat` is slow (the test holds it); meanwhile this process writes a
    revocation, then an older copy of the list is restored over it, and only then does the
    look read the list. The look had begun before the write, so it could not tell that
    the list lost it; before, it took the restored list's stamp as read, and no later
    look read the list again (unchanged): the revocation stayed off the list for good,
    and a restart while Redis was down served the key. Now the next look reads it again
    and writes it back."""
    path = tmp_path / "revoked-keys"
    add_revocations(path, [digest(1)])
    backup = path.read_bytes()
    kept = KeptRevocations(path, look_limit_s=HANG_BOUND_S)
    state = MemoryState(kept=kept)
    gate, held, stamp = threading.Event(), threading.Event(), revocation_keeper._stamp

    def slow_stamp(where: Path) -> revocation_keeper.Stamp:
        if not gate.is_set():
            held.set()
            gate.wait()
        return stamp(where)

    monkeypatch.setattr(revocation_keeper, "_stamp", slow_stamp)

    async def scenario() -> None:
        look = asyncio.create_task(kept.look())
        await asyncio.to_thread(held.wait, HANG_BOUND_S)  # the look is under way
        await state.revoke_key(digest(2))  # written: the list holds it
        assert read_revocations(path) == {digest(1), digest(2)}
        staged = path.with_name("restored")
        staged.write_bytes(backup)
        os.replace(staged, path)  # the older copy restored, before the look reads
        gate.set()
        assert await look == frozenset()
        for _ in range(3):  # before: each look found the list unchanged
            await kept.look()
            if kept._task is not None:
                await kept._task  # the write-back
        assert read_revocations(path) == {digest(1), digest(2)}
        assert state.is_revoked(digest(2)) and kept.rollbacks == 1
        await state.close()

    asyncio.run(scenario())
