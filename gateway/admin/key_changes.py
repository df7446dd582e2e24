"""Changes the admin API makes to the keys file (gateway/keys_file.py), staged so that a
failure comes before anything is recorded.

`staged_change` takes the file's lock without a thread waiting on it (non-blocking
`flock` tries on the event loop, `LOCK_WAIT_S` at most: a stuck holder, such as a
suspended `owngate keys`, must not hold threads of the default pool that backend
connections need for `getaddrinfo`), reads the file and writes the changed copy beside
it (fsynced), all before the caller records the change; `KeysChange.commit` renames it
into place. Every failure there (the lock busy, the directory or file unreadable or
unwritable, a damaged file) is a 503 `backend_unavailable` in OpenAI's error format
saying nothing was changed, never an exception after the admin record said "changed".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final, TypeVar

from gateway.errors import ErrorCode, GatewayError
from gateway.keys_file import (
    LOCK_WAIT_S,
    KeysFileBusy,
    open_keys_lock,
    read_keys_file,
    replace_keys_file,
    stage_keys_file,
    try_keys_lock,
)

__all__ = [
    "Edit",
    "KeysChange",
    "adding",
    "removing",
    "staged_change",
    "take_back",
    "unavailable",
]

_log = logging.getLogger("owngate.admin")
_POLL_S: Final = 0.02
_T = TypeVar("_T")

# Changes the stored digests in place; False when there is nothing to change.
Edit = Callable[[dict[str, list[str]]], bool]


def adding(tenant: str, key_hash: str) -> Edit:
    def edit(stored: dict[str, list[str]]) -> bool:
        stored.setdefault(tenant, []).append(key_hash)
        return True

    return edit


def removing(key_hash: str) -> Edit:
    def edit(stored: dict[str, list[str]]) -> bool:
        owner = next((t for t, hashes in stored.items() if key_hash in hashes), None)
        if owner is None:
            return False
        stored[owner] = [h for h in stored[owner] if h != key_hash]
        return True

    return edit


class KeysChange:
    """A change of the keys file written beside it, not yet in place (`staged` None: it
    changes nothing)."""

    def __init__(self, path: Path | None, staged: Path | None) -> None:
        self.path = path
        self.staged = staged

    async def commit(self) -> None:
        """Put the change in place (one rename). Raises 503 when it cannot be."""
        staged, self.staged = self.staged, None
        if staged is None or self.path is None:
            return
        try:
            await asyncio.to_thread(replace_keys_file, staged, self.path)
        except OSError as exc:
            staged.unlink(missing_ok=True)
            raise unavailable(exc) from exc

    def discard(self) -> None:
        staged, self.staged = self.staged, None
        if staged is not None:
            staged.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def staged_change(
    path: Path | None, edit: Edit, *, wait_s: float = LOCK_WAIT_S
) -> AsyncIterator[KeysChange]:
    """The keys file's lock held and `edit` staged (`KeysChange`); a change not committed
    by the end is dropped. No keys file (None), or an edit that changes nothing in the
    file as it is, takes no lock and changes nothing (a key inline in gateway.yaml is
    revoked with the keys file on a read-only mount). Raises 503 (`unavailable`) when the
    lock or the change cannot be had."""
    if path is None or not await _changes(path, edit):
        yield KeysChange(path, None)
        return
    async with _locked(path, wait_s):
        staged = await _run(_stage, path, edit)
        change = KeysChange(path, staged)
        try:
            yield change
        finally:
            change.discard()


async def take_back(path: Path, key_hash: str) -> None:
    """Remove a digest just added, for a creation that failed after writing it (the key
    was never shown, so a digest left behind lets nobody in: logged, not raised)."""
    try:
        async with staged_change(path, removing(key_hash)) as change:
            await change.commit()
    except GatewayError as exc:
        _log.warning("a failed key creation left its digest in the keys file: %s", exc.message)


def unavailable(exc: Exception) -> GatewayError:
    """The 503 for a keys file that could not be changed (nothing was)."""
    if isinstance(exc, KeysFileBusy):
        return GatewayError(
            ErrorCode.backend_unavailable,
            f"nothing was changed: {exc}",
            headers=((b"retry-after", b"1"),),
        )
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return GatewayError(
        ErrorCode.backend_unavailable,
        f"the keys file could not be changed, and nothing was: {why}",
    )


async def _changes(path: Path, edit: Edit) -> bool:
    stored = await _run(read_keys_file, path)
    return edit(stored)


def _stage(path: Path, edit: Edit) -> Path | None:
    stored = read_keys_file(path)
    return stage_keys_file(path, stored) if edit(stored) else None


@contextlib.asynccontextmanager
async def _locked(path: Path, wait_s: float) -> AsyncIterator[None]:
    fd = await _run(open_keys_lock, path)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not try_keys_lock(fd):  # non-blocking: no thread waits on the holder
            if loop.time() >= deadline:
                raise unavailable(KeysFileBusy(path))
            await asyncio.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the flock


async def _run(call: Callable[..., _T], *args: object) -> _T:
    """`call` in a worker thread (quick file work), its OSError or ValueError (a damaged
    keys file) as the 503 `unavailable`."""
    try:
        return await asyncio.to_thread(call, *args)
    except (OSError, ValueError) as exc:
        raise unavailable(exc) from exc
