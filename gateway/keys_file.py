"""The keys file `owngate keys` and the admin API write: tenants' API key digests.

`{tenants: {TENANT: [sha256:...]}}`, replaced whole in one rename (a temporary file
beside it, fsynced first), so a reader sees the old file or the new one, and the
directory fsynced after it, so a change once made (a revoked digest gone) is not undone
by a crash that loses the rename. A change holds
an exclusive `flock` on the file's directory from its read to its rename: one change at
a time, across threads (the admin API) and processes (`owngate keys` beside a running
gateway), whatever user each runs as. Without it two changes read the same file and the
second rename drops the first's: a new key lost, or a revoked key's digest written back.

The lock is the directory itself (opened read-only), never a file of its own: a lock
file made by the first changer (root's `owngate keys new`, mode 0600) could not be
opened by the next (the gateway's own user), whose change then failed after its admin
record said it was made. A change waits at most `LOCK_WAIT_S` for the lock, then raises
`KeysFileBusy`: a holder stopped with it (a suspended `owngate keys`) delays changes,
never a thread of the gateway for good.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import yaml

from gateway.plain_yaml import hidden_text
from gateway.provenance.files import fsync_directory
from gateway.small_files import read_small_file

__all__ = [
    "DIGEST",
    "LOCK_WAIT_S",
    "KeysFileBusy",
    "add_key_hash",
    "keys_file_lock",
    "open_keys_lock",
    "read_keys_file",
    "remove_key_hash",
    "stage_keys_file",
    "try_keys_lock",
]

DIGEST: Final = re.compile(r"^sha256:[0-9a-f]{64}$")
# About 75 bytes a key: room for 200,000 keys, and a bound on what a wrong path costs.
_MAX_KEYS_FILE: Final = 16 * 1024 * 1024
LOCK_WAIT_S: Final = 5.0  # the longest a change waits for another to finish
_LOCK_POLL_S: Final = 0.02


class KeysFileBusy(TimeoutError):
    """Another change (another process's `owngate keys`, say) held the keys file's lock
    for all of `LOCK_WAIT_S`."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"another change of {path.name} held its lock for {LOCK_WAIT_S:g} s; retry"
        )


def read_keys_file(path: Path) -> dict[str, list[str]]:
    """Read `{tenants: {TENANT: [sha256:...]}}`; a missing file holds no keys."""
    try:
        raw = read_small_file(path, _MAX_KEYS_FILE)
    except FileNotFoundError:
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None  # never the bytes it holds
    hidden = hidden_text(text)
    if hidden is not None:  # a digest bound to a tenant unseen in a review (plain_yaml.py)
        line, column, why = hidden
        raise ValueError(f"{path}:{line}:{column}: {why}")
    twice = _written_twice(text)
    if twice is not None:
        raise ValueError(
            f"{path}: line {twice}: a key is written twice in one mapping, or merged into "
            "one (<<) (YAML keeps only the last copy: a tenant's first list of digests "
            "would be dropped unseen); write each tenant once"
        )
    data = yaml.safe_load(text) or {}
    tenants = data.get("tenants", {}) if isinstance(data, dict) else None
    if not isinstance(tenants, dict):
        raise ValueError(f"{path}: expected a mapping 'tenants: {{TENANT: [sha256:...]}}'")
    result: dict[str, list[str]] = {}
    for tenant, hashes in tenants.items():
        if not isinstance(hashes, list) or not all(
            isinstance(h, str) and DIGEST.match(h) for h in hashes
        ):
            raise ValueError(f"{path}: tenants.{tenant} must be a list of 'sha256:<hex>' digests")
        result[str(tenant)] = list(hashes)
    return result


def _written_twice(text: str) -> int | None:
    """The line of the first mapping key `text` writes a second time in one mapping (a
    tenant listed twice), or None. Unparsable text is left to `yaml.safe_load`."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    pending = [root] if root is not None else []
    visited: set[int] = set()  # each node once: an alias may name one again, or itself
    while pending:
        node = pending.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: set[object] = set()
            for key, value in node.value:
                if key.tag == "tag:yaml.org,2002:merge":  # `<<: *other`: the last copy wins
                    return int(key.start_mark.line) + 1  # over its keys unseen; none written
                written = key.value if isinstance(key, yaml.ScalarNode) else id(key)
                if written in seen:
                    return int(key.start_mark.line) + 1
                seen.add(written)
                pending.append(value)
        elif isinstance(node, yaml.SequenceNode):
            pending.extend(node.value)
    return None


def add_key_hash(path: Path, tenant: str, key_hash: str) -> None:
    """Append a digest to the key file atomically (write a temp file, fsync, rename).
    Raises `KeysFileBusy` or another OSError when the file cannot be changed."""
    with keys_file_lock(path):
        stored = read_keys_file(path)
        stored.setdefault(tenant, []).append(key_hash)
        replace_keys_file(stage_keys_file(path, stored), path)


def remove_key_hash(path: Path, key_hash: str) -> str | None:
    """Remove a digest from the key file atomically; the tenant it belonged to, or None
    when the file does not hold it (then the file is left untouched, and no lock is taken:
    a key listed inline in gateway.yaml is revoked with a keys file on a read-only mount)."""
    if not any(key_hash in hashes for hashes in read_keys_file(path).values()):
        return None  # no change adds back a digest it removes: absent stays absent
    with keys_file_lock(path):
        stored = read_keys_file(path)
        owner = next((tenant for tenant, hashes in stored.items() if key_hash in hashes), None)
        if owner is None:
            return None
        stored[owner] = [h for h in stored[owner] if h != key_hash]
        replace_keys_file(stage_keys_file(path, stored), path)
        return owner


def open_keys_lock(path: Path) -> int:
    """A descriptor of the keys file's directory (made if missing), to `flock`: opened
    read-only, so any user who may read the directory may lock it. Close it to unlock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)


def try_keys_lock(fd: int) -> bool:
    """Take the exclusive lock on `fd` (`open_keys_lock`) if it is free; never waits."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def keys_file_lock(
    path: Path,
    *,
    wait_s: float = LOCK_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> Iterator[None]:
    """Hold the keys file's lock (the module's text) while its digests are read, changed
    and written back. Raises `KeysFileBusy` after `wait_s` without it, an OSError when the
    directory cannot be opened."""
    fd = open_keys_lock(path)
    try:
        deadline = clock() + wait_s
        while not try_keys_lock(fd):
            if clock() >= deadline:
                raise KeysFileBusy(path)
            pause(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the flock


def stage_keys_file(path: Path, stored: dict[str, list[str]]) -> Path:
    """Write `stored` to a temporary file beside `path` (fsynced, with `path`'s mode, or
    0600 for a new file) and return its name: `os.replace` it onto `path` to make the
    change, or unlink it to drop it. Call with the lock held."""
    body = "# Written by `owngate keys`: SHA-256 digests of tenant API keys.\n"
    body += yaml.safe_dump({"tenants": stored}, sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # the replacement keeps the file's mode, so a gateway that read it still can
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None  # a new file stays mkstemp's 0600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def replace_keys_file(staged: Path, path: Path) -> None:
    """Rename `staged` (from `stage_keys_file`) onto `path`, then fsync the directory: a
    revocation acknowledged is not undone by a crash that loses the rename (the old file,
    revoked digest and all, back in place)."""
    try:
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
