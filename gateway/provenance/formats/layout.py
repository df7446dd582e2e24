"""Names inside a log directory, shared by the writer and the auditor tools.

LOGDIR/
  checkpoint                 latest signed checkpoint (tlog-tiles, served as is)
  checkpoints/<size:020d>    every checkpoint ever signed, by tree size (history)
  tile/<L>/<N>[.p/<W>]       Merkle tiles (tlog-tiles)
  tile/entries/<N>[.p/<W>]   entry bundles (tlog-tiles)
  wal/<first:020d>.wal       entries not yet covered by a checkpoint (see `wal`)
  cosigned/<size:020d>       a cosigned checkpoint (see `writer.cosignature_collector`)
  .lock                      held by the one writer

An auditor reads a log directory the audited operator handed over: any file in it may be
a symlink to `/dev/zero` or a FIFO, or a sparse file of terabytes. `read_log_file` reads
one file of it bounded (a note `MAX_NOTE_FILE`, a hash tile or entry bundle what its
full width holds) and refuses anything but a regular file, so such a file is a failed
check naming it, not an audit that hangs or exhausts memory. Nor may a folder of millions
of checkpoint files: for the auditor `list_history` and `list_cosigned` list at most
`limit` of them (`MAX_HISTORY` by default, `owngate audit verify --max-checkpoints`; the
writer lists its own log whole), and `newest_history`, `newest_cosigned` and
`first_history_above` keep only the one name they look for (`history_upto`, none).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.provenance.errors import MalformedError
from gateway.small_files import open_regular_file, read_small_file

__all__ = [
    "CHECKPOINT",
    "COSIGNED",
    "HISTORY",
    "LOCK",
    "MAX_HISTORY",
    "MAX_HISTORY_BYTES",
    "MAX_NOTE_FILE",
    "NOT_A_FILE",
    "WAL",
    "cosigned_path",
    "first_history_above",
    "history_path",
    "history_upto",
    "is_index_name",
    "list_cosigned",
    "list_history",
    "newest_cosigned",
    "newest_history",
    "open_log_file",
    "read_log_file",
]

CHECKPOINT = "checkpoint"
HISTORY = "checkpoints"
WAL = "wal"
COSIGNED = "cosigned"
LOCK = ".lock"
MAX_NOTE_FILE = 1 << 20  # a checkpoint or cosigned note: its lines and signatures
#: checkpoint files an audit lists in `checkpoints/` (and in `cosigned/`), and the bytes of
#: `checkpoints/` it holds (an honest note is a few hundred bytes; one is signed at most
#: every `checkpoint_interval_ms` while entries come, so a busy log signs 86,400 a day).
#: The defaults keep an audit to about 2 GiB; `--max-checkpoints` and `--max-history-bytes`
#: raise them for a log that holds more.
MAX_HISTORY = 1_000_000
MAX_HISTORY_BYTES = 256 << 20


#: What opening a path that is no file says: a symlink loop, a socket or a device without
#: a driver (ENXIO, ENODEV). Damage, as a FIFO there is, not a disk the system refuses.
NOT_A_FILE = (errno.ELOOP, errno.ENXIO, errno.ENODEV)


def read_log_file(path: Path, limit: int = MAX_NOTE_FILE, *, follow: bool = True) -> bytes:
    """The bytes of the log file at `path`, at most `limit`: FileNotFoundError when it is
    absent, MalformedError when it is not a regular file (a symlink loop, a socket or a
    device included; a symbolic link when `follow` is false) or is larger, OSError
    otherwise."""
    with _as_log_file(path, limit):
        return read_small_file(path, limit, follow=follow)


def open_log_file(path: Path, limit: int, *, follow: bool = True) -> tuple[int, int]:
    """A descriptor open for reading on the log file at `path`, and its size (for a
    reader that streams it); refused as `read_log_file` refuses, the descriptor closed."""
    with _as_log_file(path, limit):
        fd, status = open_regular_file(path, follow=follow)
        if status.st_size > limit:
            os.close(fd)
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return fd, status.st_size


@contextmanager
def _as_log_file(path: Path, limit: int) -> Iterator[None]:
    """An OSError within, reading the log file at `path`, raised as a MalformedError when
    it says the file is none a log holds (see `_malformed`); FileNotFoundError and every
    other OSError pass unchanged."""
    try:
        yield
    except FileNotFoundError:
        raise
    except OSError as exc:
        malformed = _malformed(path, limit, exc)
        if malformed is None:
            raise
        raise malformed from exc


def _malformed(path: Path, limit: int, exc: OSError) -> MalformedError | None:
    """`exc` as a MalformedError naming `path` when it says the file is none a log holds
    (not a regular file, or too large); None for any other failure."""
    if exc.errno not in (errno.EINVAL, errno.EFBIG, *NOT_A_FILE):
        return None
    why = f"{exc.strerror}: a log file is a regular file of at most {limit} bytes"
    return MalformedError(f"{path}: {why}")


def history_path(directory: Path, size: int) -> Path:
    return directory / HISTORY / f"{size:020d}"


def list_history(directory: Path, limit: int | None = None) -> list[tuple[int, Path]]:
    """History checkpoints as (size from the file name, path), smallest first; more than
    `limit` of them (the auditor's; the writer lists its own log whole) is a MalformedError
    naming the limit."""
    return _by_size(directory / HISTORY, limit)


def newest_history(directory: Path) -> tuple[int, Path] | None:
    """The newest history checkpoint, listing the folder without keeping it (None if none)."""
    return _newest(directory / HISTORY)


def first_history_above(
    directory: Path, index: int, limit: int | None = None
) -> tuple[int, Path] | None:
    """The smallest history checkpoint whose size is above `index` (the first to cover
    entry `index`), listing the folder without keeping it (None if none); more than `limit`
    files is a MalformedError naming the limit."""
    folder = directory / HISTORY
    first: tuple[int, Path] | None = None
    for count, name in enumerate(_index_names(folder), 1):
        if limit is not None and count > limit:
            raise _too_many(folder, limit)
        size = int(name)
        if size > index and (first is None or size < first[0]):
            first = (size, folder / name)
    return first


def history_upto(
    directory: Path, upto: int, limit: int | None = None
) -> Iterator[tuple[int, Path]]:
    """The history checkpoints of a size at most `upto`, as (size, path), in no order and
    one at a time (the listing is not kept); more than `limit` files in the folder is a
    MalformedError naming the limit."""
    folder = directory / HISTORY
    for count, name in enumerate(_index_names(folder), 1):
        if limit is not None and count > limit:
            raise _too_many(folder, limit)
        if int(name) <= upto:
            yield int(name), folder / name


def cosigned_path(directory: Path, size: int) -> Path:
    return directory / COSIGNED / f"{size:020d}"


def list_cosigned(directory: Path, limit: int | None = None) -> list[tuple[int, Path]]:
    """Witness-cosigned checkpoints as (size from the file name, path), smallest first; more
    than `limit` of them is a MalformedError naming the limit."""
    return _by_size(directory / COSIGNED, limit)


def newest_cosigned(
    directory: Path, above: int = -1, upto: int | None = None
) -> tuple[int, Path] | None:
    """The newest cosigned checkpoint of a size above `above` and at most `upto`, listing
    the folder without keeping it (None if none)."""
    return _newest(directory / COSIGNED, above, upto)


def _index_names(folder: Path) -> Iterator[str]:
    """The names in `folder` that `is_index_name`, one at a time (none if no folder)."""
    if not folder.is_dir():
        return
    with os.scandir(folder) as items:
        for item in items:
            if is_index_name(item.name):
                yield item.name


def _newest(folder: Path, above: int = -1, upto: int | None = None) -> tuple[int, Path] | None:
    sizes = map(int, _index_names(folder))
    newest = max((n for n in sizes if above < n and (upto is None or n <= upto)), default=None)
    return None if newest is None else (newest, folder / f"{newest:020d}")


def _too_many(folder: Path, limit: int) -> MalformedError:
    return MalformedError(
        f"{folder} holds more than {limit} checkpoint files, the most an audit reads (raise "
        "it with --max-checkpoints)"
    )


def _by_size(folder: Path, limit: int | None) -> list[tuple[int, Path]]:
    found: list[tuple[int, Path]] = []
    for name in _index_names(folder):
        if limit is not None and len(found) == limit:
            raise _too_many(folder, limit)
        found.append((int(name), folder / name))
    return sorted(found)


def is_index_name(name: str) -> bool:
    """Whether `name` is a size or index as the writer names files: 20 ASCII digits
    (str.isdecimal() and int() also take other scripts' digits, U+0660 or U+FF10: a
    second file for one size the writer never wrote)."""
    return len(name) == 20 and name.isascii() and name.isdigit()
