"""The keys file's lock (gateway/keys_file.py): a change waits for it at most
`LOCK_WAIT_S`, and the admin API's changes wait for it without holding a thread of the
default pool (gateway/admin/key_changes.py). That both users take it: test_keys_file.py.

Found by review: the lock was `.keys.yaml.lock`, created 0600 by whoever changed keys
first; the other user then got PermissionError (and the admin API's revocation raised
after its admin record said the key was revoked), and `flock(LOCK_EX)` waited without
bound in `asyncio.to_thread`: 32 key changes behind a stuck holder stalled `getaddrinfo`
for backend connections."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

import pytest

from gateway.admin import key_changes
from gateway.admin.key_changes import adding, staged_change
from gateway.errors import GatewayError
from gateway.keys_file import KeysFileBusy, add_key_hash, keys_file_lock, read_keys_file
from gateway.keys_file import try_keys_lock as key_changes_try
from gateway.tenants import hash_api_key
from tests.helpers.waiting import until_async

NOBODY = 65534
WAIT_S = 30.0


def _hold(directory: Path) -> int:
    """Another change holding the lock (a suspended `owngate keys`); close to let go."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_change_waits_for_a_stuck_holder_only_until_its_deadline(tmp_path: Path) -> None:
    now = [0.0]
    holder = _hold(tmp_path)
    try:
        with (
            pytest.raises(KeysFileBusy),
            keys_file_lock(
                tmp_path / "keys.yaml",
                wait_s=5.0,
                clock=lambda: now[0],
                pause=lambda s: now.__setitem__(0, now[0] + s),
            ),
        ):
            raise AssertionError("the lock was taken while another held it")
    finally:
        os.close(holder)
    assert 5.0 <= now[0] < 5.1
    with keys_file_lock(tmp_path / "keys.yaml"):  # free again
        pass


def test_admin_changes_behind_a_stuck_holder_hold_no_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 key creations wait for the lock (each has tried it); a call on the default pool
    still runs (say, a `getaddrinfo` for a backend connection)."""
    keys = tmp_path / "keys.yaml"
    add_key_hash(keys, "team", hash_api_key("og-0"))
    tried: set[int] = set()  # the lock descriptors tried so far

    def trying(fd: int) -> bool:
        tried.add(fd)
        return key_changes_try(fd)

    monkeypatch.setattr(key_changes, "try_keys_lock", trying)

    async def create(i: int) -> None:
        async with staged_change(keys, adding("team", hash_api_key(f"og-{i}")), wait_s=WAIT_S):
            raise AssertionError("the lock was taken while another held it")

    async def scenario() -> list[BaseException | None]:
        holder = _hold(tmp_path)
        try:
            waiting = [asyncio.ensure_future(create(i)) for i in range(1, 33)]
            await until_async(lambda: len(tried) == 32, "every creation waits", timeout=WAIT_S)
            ran = await asyncio.wait_for(asyncio.to_thread(lambda: "ran"), WAIT_S)
            assert ran == "ran"
            assert not any(task.done() for task in waiting)
        finally:
            os.close(holder)
        return await asyncio.gather(*waiting, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    # the holder gone, each took the lock in turn (and failed only by this test's design)
    assert all(isinstance(o, AssertionError) for o in outcomes), outcomes
    assert read_keys_file(keys) == {"team": [hash_api_key("og-0")]}  # nothing committed


def test_an_admin_change_behind_a_stuck_holder_is_a_503_with_retry_after(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys.yaml"

    async def create() -> None:
        async with staged_change(keys, adding("team", hash_api_key("og-1")), wait_s=0.05):
            raise AssertionError("the lock was taken while another held it")

    holder = _hold(tmp_path)
    try:
        with pytest.raises(GatewayError) as busy:
            asyncio.run(create())
    finally:
        os.close(holder)
    assert busy.value.status == 503
    assert busy.value.headers == ((b"retry-after", b"1"),)
    assert "nothing was changed" in busy.value.message
    assert not keys.exists()
