"""A witness's memory: the latest tree (size, root hash) it cosigned for each log origin.

Kept in one JSON file, `{"v": 1, "logs": {origin: {"size": N, "root": base64, "keys": [..],
"seen": [..]}}}` (the log keys that signed, for rotations; absent in older files), replaced
atomically on every change (temporary file, fsync, rename, fsync of the directory), so
after a crash it holds the old state or the new one, never a mix, and a restarted witness
keeps refusing rollbacks. An exclusive `flock` on `<state>.lock` keeps a second witness
process off the same file: two processes sharing one state could each roll the other back.
A state file that cannot be read is an error, never an empty state.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType

from gateway.provenance.errors import MalformedError, ProvenanceError
from gateway.provenance.files import write_files_atomically
from gateway.provenance.formats.merkle import HASH_SIZE

__all__ = ["STATE_VERSION", "StateLockedError", "TreeHead", "WitnessState"]

STATE_VERSION = 1


class StateLockedError(ProvenanceError):
    """Another witness process holds the state file's lock."""


@dataclass(frozen=True, slots=True)
class TreeHead:
    """The latest tree of one log that the witness cosigned."""

    size: int
    root: bytes
    # The log's keys (`name+hexid`) that signed a checkpoint it cosigned: `keys` those that
    # appeared last (a rotation's new key), `seen` all of them. Not part of the tree head.
    keys: tuple[str, ...] = field(default=(), compare=False)
    seen: tuple[str, ...] = field(default=(), compare=False)


def _key_list(origin: str, value: object, path: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value):
        raise MalformedError(f"{path}: log {origin!r} has 'keys' or 'seen' that is not a list")
    return tuple(sorted(set(value)))


def _parse_head(origin: str, value: object, path: Path) -> TreeHead:
    if not isinstance(value, dict) or set(value) not in (
        {"size", "root"},
        {"size", "root", "keys", "seen"},
    ):
        raise MalformedError(
            f"{path}: log {origin!r} needs exactly 'size' and 'root' (and 'keys', 'seen')"
        )
    size, root = value["size"], value["root"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise MalformedError(f"{path}: log {origin!r} has a size that is not an integer >= 0")
    if not isinstance(root, str):
        raise MalformedError(f"{path}: log {origin!r} has a root that is not a string")
    try:
        digest = base64.b64decode(root.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise MalformedError(f"{path}: log {origin!r} has a root that is not base64") from exc
    if len(digest) != HASH_SIZE:
        raise MalformedError(f"{path}: log {origin!r} has a root that is not a 32-byte hash")
    keys = _key_list(origin, value.get("keys", []), path)
    seen = _key_list(origin, value.get("seen", []), path)
    return TreeHead(size, digest, keys, seen)


def _load(path: Path) -> dict[str, TreeHead]:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedError(f"{path} is not a witness state file (invalid JSON)") from exc
    if not isinstance(data, dict) or set(data) != {"v", "logs"}:
        raise MalformedError(f"{path} is not a witness state file (needs 'v' and 'logs')")
    if data["v"] != STATE_VERSION:
        raise MalformedError(f"{path}: witness state version {data['v']!r} is not supported")
    logs = data["logs"]
    if not isinstance(logs, dict):
        raise MalformedError(f"{path}: 'logs' is not an object")
    return {origin: _parse_head(origin, value, path) for origin, value in logs.items()}


def _encode(heads: Mapping[str, TreeHead]) -> bytes:
    logs: dict[str, dict[str, object]] = {}
    for origin, head in sorted(heads.items()):
        logs[origin] = {"size": head.size, "root": base64.b64encode(head.root).decode()}
        if head.seen:
            logs[origin].update(keys=list(head.keys), seen=list(head.seen))
    return json.dumps({"v": STATE_VERSION, "logs": logs}, indent=1, sort_keys=True).encode()


class WitnessState:
    """The witness's per-origin tree heads, loaded from and persisted to one file.

    Not thread-safe on its own: `Witness` serialises the check-then-update under its lock.
    """

    def __init__(self, path: Path, heads: dict[str, TreeHead], lock_fd: int) -> None:
        self.path = path
        self._heads = heads
        self._lock_fd: int | None = lock_fd

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> WitnessState:
        """Lock and load the state at `path`; a missing file is a witness that saw nothing.

        Raises StateLockedError when another process holds it, MalformedError when the file
        exists but is not a valid state (it is never silently reset).
        """
        target = Path(path).absolute()
        if not target.parent.is_dir():
            raise FileNotFoundError(f"directory {target.parent} of the witness state is missing")
        lock_fd = os.open(target.with_name(target.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(lock_fd)
            raise StateLockedError(f"{target} is in use by another witness process") from exc
        try:
            heads = _load(target)
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(target, heads, lock_fd)

    @property
    def heads(self) -> Mapping[str, TreeHead]:
        return MappingProxyType(self._heads)

    def get(self, origin: str) -> TreeHead | None:
        return self._heads.get(origin)

    def update(self, origin: str, head: TreeHead) -> None:
        """Persist `head` for `origin` durably, then adopt it (OSError leaves both unchanged)."""
        if self._lock_fd is None:
            raise ValueError("the witness state is closed")
        changed = {**self._heads, origin: head}
        write_files_atomically([(self.path, _encode(changed))], root=self.path.parent)
        self._heads = changed

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __enter__(self) -> WitnessState:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
