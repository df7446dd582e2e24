"""This host's revoked keys list (gateway/state/revocation_list.py) and a state's side of
it (revocation_keeper.py): read strictly, so a list that was cut short, edited or
corrupted stops the state from being built (the gateway does not start) instead of
starting without the revocations it held; written whole and never over a list it
cannot read; and a state built on it refuses those keys from the start."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.state import RevocationListError, create_state
from gateway.state.revocation_keeper import KeptRevocations
from gateway.state.revocation_list import (
    MAX_DIGESTS,
    add_revocations,
    parse_revocations,
    read_revocations,
    render_revocations,
)
from tests.helpers.waiting import until_async


def digest(n: int) -> str:
    return "sha256:" + hashlib.sha256(str(n).encode()).hexdigest()


DIGESTS = {digest(n) for n in range(3)}


def test_a_list_reads_back_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "revoked-keys"
    assert read_revocations(path) == frozenset()  # no file yet: nothing revoked here
    assert add_revocations(path, DIGESTS) == 3
    assert read_revocations(path) == DIGESTS
    assert add_revocations(path, [digest(1), digest(7)]) == 1  # a union, never a loss
    assert read_revocations(path) == DIGESTS | {digest(7)}
    assert add_revocations(path, [digest(7)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # digests only, the gateway reads it
    assert sorted(p.name for p in tmp_path.iterdir()) == [".revoked-keys.lock", "revoked-keys"]
    assert parse_revocations(render_revocations(()), "x") == frozenset()


def test_every_flipped_byte_and_every_cut_is_refused() -> None:
    raw = render_revocations(DIGESTS)
    assert parse_revocations(raw, "list") == DIGESTS
    for at in range(len(raw)):  # a flipped hex digit still looks like a digest
        flipped = raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1 :]
        with pytest.raises(RevocationListError):
            parse_revocations(flipped, "list")
    for size in range(len(raw)):  # cut short anywhere, a line boundary included
        with pytest.raises(RevocationListError):
            parse_revocations(raw[:size], "list")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"sha256:" + b"0" * 64 + b"\n",  # no header, no end line
        render_revocations(DIGESTS).replace(b"\n", b"\r\n"),
        render_revocations(DIGESTS) + b"sha256:" + b"0" * 64 + b"\n",  # a line past the end
        render_revocations(DIGESTS).upper(),
    ],
)
def test_what_is_no_list_is_refused_without_quoting_it(raw: bytes) -> None:
    with pytest.raises(RevocationListError) as caught:
        parse_revocations(raw, "revoked-keys")
    assert str(caught.value).startswith("revoked-keys")
    assert "0000" not in str(caught.value)


def test_a_line_that_is_no_digest_is_named_by_its_number() -> None:
    lines = render_revocations(DIGESTS).split(b"\n")
    lines[2] = b"og-a-key-not-its-digest"
    with pytest.raises(RevocationListError, match=r"^list:3: not a key digest"):
        parse_revocations(b"\n".join(lines), "list")


def test_a_list_that_cannot_be_read_is_an_error_and_never_written_over(tmp_path: Path) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir()
    with pytest.raises(RevocationListError, match="cannot be read"):
        read_revocations(directory)
    path = tmp_path / "revoked-keys"
    corrupt = render_revocations(DIGESTS)[:-5] + b"\n"
    path.write_bytes(corrupt)
    with pytest.raises(RevocationListError):
        add_revocations(path, [digest(9)])
    assert path.read_bytes() == corrupt  # its revocations are not lost by a rewrite
    assert not list(tmp_path.glob(".revoked-keys.*[!k]"))  # no temporary file left


def test_only_digests_are_written_and_the_size_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "revoked-keys"
    with pytest.raises(ValueError, match="digests only"):
        add_revocations(path, ["og-a-key-itself"])
    with pytest.raises(ValueError, match="digests only"):
        KeptRevocations(path).note([digest(1), "sha256:short"])
    assert not path.exists()
    path.write_bytes(render_revocations(digest(n) for n in range(MAX_DIGESTS)))
    with pytest.raises(RevocationListError, match="more than"):
        add_revocations(path, [digest(MAX_DIGESTS)])
    assert len(read_revocations(path)) == MAX_DIGESTS


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_state_refuses_the_listed_keys_from_the_start(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "revoked-keys"
    add_revocations(path, [digest(1)])
    url = "redis://127.0.0.1:1/0"  # never reached: the state is only built
    state = create_state(backend, url, revocations_file=path)  # type: ignore[arg-type]
    assert state.is_revoked(digest(1)) and not state.is_revoked(digest(2))
    path.write_bytes(b"owngate-revoked-keys v1\n")  # cut short: no state, no start
    with pytest.raises(RevocationListError):
        create_state(backend, url, revocations_file=path)  # type: ignore[arg-type]


def test_a_memory_state_writes_its_revocations_for_the_next_process(tmp_path: Path) -> None:
    path = tmp_path / "revoked-keys"

    async def revoke() -> None:
        state = create_state("memory", revocations_file=path)
        await state.revoke_key(digest(5))
        await state.close()

    asyncio.run(revoke())
    assert read_revocations(path) == {digest(5)}
    assert create_state("memory", revocations_file=path).is_revoked(digest(5))


def test_a_failed_write_is_kept_for_the_next(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    kept = KeptRevocations(blocker / "revoked-keys")  # no list yet
    blocker.write_text("")  # now its directory cannot be made

    async def twice() -> None:
        kept.note([digest(1)])
        await kept.flush()
        await kept.flush()

    asyncio.run(twice())
    assert kept.unwritten == 1
    blocker.unlink()
    blocker.mkdir()
    asyncio.run(kept.flush())
    assert kept.unwritten == 0
    assert read_revocations(blocker / "revoked-keys") == {digest(1)}


def test_a_lock_file_that_is_no_regular_file_fails_the_write_at_once(tmp_path: Path) -> None:
    """A FIFO where the list's lock file goes (made there by whoever may write the
    directory): the write fails at once, naming it, and the revocation stays enforced.
    Before, opening it waited for a writer for good: `revoke_key` (an admin revocation)
    never returned, every later write of the list queued behind it, and a revocation
    learned from Redis, enforced only once its write ends, was never enforced."""
    path = tmp_path / "revoked-keys"
    lock = tmp_path / ".revoked-keys.lock"
    os.mkfifo(lock)
    state = create_state("memory", revocations_file=path)
    done: list[BaseException | None] = []

    def revoke() -> None:
        try:
            asyncio.run(state.revoke_key(digest(3)))
            done.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            done.append(exc)

    thread = threading.Thread(target=revoke, daemon=True)
    thread.start()
    thread.join(timeout=30)  # a bound on a hang, not a wait for one: at once when fixed
    if thread.is_alive():  # before: still opening the FIFO; let it go, then fail
        with contextlib.suppress(OSError):
            os.close(os.open(lock, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=30)
        pytest.fail("revoke_key waited for good on a FIFO at the list's lock file")
    assert done == [None]
    assert state.is_revoked(digest(3))
    assert state.status().unlisted_revocations == 1  # not written: said (status, log)
    with pytest.raises(OSError, match="not a regular file"):
        add_revocations(path, [digest(4)])
    assert not path.exists()


def test_a_look_that_fails_unexpectedly_fails_closed_and_the_watch_goes_on(
    tmp_path: Path,
) -> None:
    """A look at the list that raises something unforeseen (here `listed`, while the
    test says so): the state refuses tenant requests until a look succeeds (`damaged`),
    and the watch goes on: the digests a failed look found are handed over by the next.
    Before, the exception ended the watch task without a word: the process never read
    the list again, and what `owngate keys revoke` listed later stayed served."""
    path = tmp_path / "revoked-keys"
    kept = KeptRevocations(path, watch_s=0.01)
    handed: list[frozenset[str]] = []
    broken = [True]
    raised = [0]

    def listed(digests: frozenset[str]) -> None:
        if broken[0]:
            raised[0] += 1
            raise RuntimeError("a bug in what the state does with them")
        handed.append(digests)

    kept.listed = listed

    async def scenario() -> None:
        kept.watch()
        try:
            add_revocations(path, [digest(1)])
            await until_async(lambda: raised[0] >= 3, "looks failing, and going on")
            assert kept.damaged is not None  # refusing tenant requests meanwhile
            assert "the look at it failed (RuntimeError)" in kept.damaged
            broken[0] = False
            await until_async(lambda: kept.damaged is None, "a look after the failed ones")
            assert handed == [{digest(1)}]
            add_revocations(path, [digest(2)])
            await until_async(lambda: len(handed) == 2, "a later change seen")
            assert handed[1] == {digest(2)}
        finally:
            await kept.close()

    with capture_logs() as logs:
        asyncio.run(scenario())
    errors = [e["event"] for e in logs if e["log_level"] == "error"]
    assert errors == ["revoked keys list look failed"]  # once, until a look succeeds
