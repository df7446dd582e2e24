"""A witness's memory: the latest tree (size, root hash) it cosigned for each log origin.

Kept in one JSON file, `{"v": 1, "logs": {origin: {"size": N, "root": base64, "keys": [..],
"seen": [..], "time": T}}}` (the log keys that signed, for rotations, and the timestamp of
the newest cosignature issued, so timestamps never go back; each absent in older files), replaced
atomically on every change (temporary file, fsync, rename, fsync of the directory), so
after a crash it holds the old state or the new one, never a mix, and a restarted witness
keeps refusing rollbacks. An exclusive `flock` on `<state>.lock` keeps a second witness
process off the same file: two processes sharing one state could each roll the other back.
A state file that cannot be read is an error, never an empty state, and so is a missing
one: a new witness's state is created on purpose (`WitnessState.open(path, new=True)`,
`owngate witness init`).
"""

from __future__ import annotations

import base64
import binascii
import errno
import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType

from gateway.provenance.errors import MalformedError, ProvenanceError
from gateway.provenance.files import write_files_atomically
from gateway.provenance.formats.cosignature import MAX_TIMESTAMP
from gateway.provenance.formats.layout import NOT_A_FILE
from gateway.provenance.formats.merkle import HASH_SIZE
from gateway.small_files import read_small_file

__all__ = [
    "MAX_STATE_FILE",
    "STATE_VERSION",
    "StateExistsError",
    "StateLockedError",
    "StateMissingError",
    "TreeHead",
    "WitnessState",
]

STATE_VERSION = 1
#: The largest state file read or written: a FIFO, a device or a larger file is refused
#: (MalformedError) rather than waited on or read whole. An entry is a few hundred bytes
#: per log trusted (`serve --workers` logs included) and per key that signed it.
MAX_STATE_FILE = 64 << 20


class StateLockedError(ProvenanceError):
    """Another witness process holds the state file's lock."""


class StateMissingError(ProvenanceError):
    """The state file is missing: the witness would have forgotten what it cosigned."""


class StateExistsError(ProvenanceError):
    """A new state was asked for where one exists already."""


@dataclass(frozen=True, slots=True)
class TreeHead:
    """The latest tree of one log that the witness cosigned."""

    size: int
    root: bytes
    # The log's keys (`name+hexid`) that signed a checkpoint it cosigned: `keys` those that
    # appeared last (a rotation's new key), `seen` all of them. Not part of the tree head.
    keys: tuple[str, ...] = field(default=(), compare=False)
    seen: tuple[str, ...] = field(default=(), compare=False)
    # The timestamp (POSIX seconds) of the newest cosignature issued for the log: the next
    # one is never dated earlier, across restarts and clock steps. 0: none recorded.
    time: int = field(default=0, compare=False)


def _key_list(origin: str, value: object, path: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value):
        raise MalformedError(f"{path}: log {origin!r} has 'keys' or 'seen' that is not a list")
    return tuple(sorted(set(value)))


_REQUIRED = frozenset({"size", "root"})
_OPTIONAL = frozenset({"keys", "seen", "time"})


def _parse_head(origin: str, value: object, path: Path) -> TreeHead:
    if (
        not isinstance(value, dict)
        or not _REQUIRED <= set(value) <= _REQUIRED | _OPTIONAL
        or ("keys" in value) != ("seen" in value)
    ):
        raise MalformedError(
            f"{path}: log {origin!r} needs exactly 'size' and 'root' (and 'keys' with "
            "'seen', 'time')"
        )
    size, root, time = value["size"], value["root"], value.get("time", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise MalformedError(f"{path}: log {origin!r} has a size that is not an integer >= 0")
    if not isinstance(time, int) or isinstance(time, bool) or not 0 <= time <= MAX_TIMESTAMP:
        raise MalformedError(f"{path}: log {origin!r} has a time that is not a timestamp")
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
    return TreeHead(size, digest, keys, seen, time)


def _create(path: Path) -> dict[str, TreeHead]:
    """An empty state written durably at `path` (the caller holds the lock)."""
    if path.exists() or path.is_symlink():
        raise StateExistsError(
            f"witness state {path} already exists: a new witness starts from a new file "
            "(this one holds what the witness cosigned; serve it as it is)"
        )
    write_files_atomically([(path, _encode({}))], root=path.parent)
    return {}


def _load(path: Path) -> dict[str, TreeHead]:
    try:
        data = json.loads(read_small_file(path, MAX_STATE_FILE))
    except FileNotFoundError as exc:
        raise StateMissingError(
            f"witness state {path} does not exist: a witness that lost its state would "
            "cosign a rollback or a fork of the logs it witnessed. Restore the file; only "
            "for a new witness (a new key, if this one ever cosigned) create it with "
            "`owngate witness init`"
        ) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedError(f"{path} is not a witness state file (invalid JSON)") from exc
    except OSError as exc:  # a FIFO, a device or larger: not waited on, not read whole
        if exc.errno not in (errno.EINVAL, errno.EFBIG, *NOT_A_FILE):
            raise
        raise MalformedError(
            f"{path} is not a witness state file ({exc.strerror}: it is a regular file "
            f"of at most {MAX_STATE_FILE} bytes)"
        ) from exc
    if not isinstance(data, dict) or set(data) != {"v", "logs"}:
        raise MalformedError(f"{path} is not a witness state file (needs 'v' and 'logs')")
    if type(data["v"]) is not int or data["v"] != STATE_VERSION:  # `true == 1` in Python
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
        if head.time:
            logs[origin]["time"] = head.time
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
    def open(cls, path: str | os.PathLike[str], *, new: bool = False) -> WitnessState:
        """Lock and load the state at `path`; with `new`, create it, empty, instead.

        A missing file is never taken for a witness that saw nothing: a witness without
        its state would cosign a rollback or a fork of every log it witnessed. Raises
        StateMissingError for a missing file (without `new`), StateExistsError for an
        existing one (with `new`), StateLockedError when another process holds it, and
        MalformedError when the file is not a valid state (it is never silently reset).
        The path's symlinks are resolved first, so every name for one file shares its lock.
        """
        target = Path(os.path.realpath(path))
        if not target.parent.is_dir():
            raise FileNotFoundError(f"directory {target.parent} of the witness state is missing")
        lock_fd = os.open(target.with_name(target.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(lock_fd)
            raise StateLockedError(f"{target} is in use by another witness process") from exc
        try:
            heads = _create(target) if new else _load(target)
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
        encoded = _encode(changed)
        if len(encoded) > MAX_STATE_FILE:  # a state it could not load again: refused now
            raise OSError(errno.EFBIG, f"larger than {MAX_STATE_FILE} bytes", str(self.path))
        write_files_atomically([(self.path, encoded)], root=self.path.parent)
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
