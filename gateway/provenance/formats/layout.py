"""Names inside a log directory, shared by the writer and the auditor tools.

LOGDIR/
  checkpoint                 latest signed checkpoint (tlog-tiles, served as is)
  checkpoints/<size:020d>    every checkpoint ever signed, by tree size (history)
  tile/<L>/<N>[.p/<W>]       Merkle tiles (tlog-tiles)
  tile/entries/<N>[.p/<W>]   entry bundles (tlog-tiles)
  wal/<first:020d>.wal       entries not yet covered by a checkpoint (see `wal`)
  cosigned/<size:020d>       a cosigned checkpoint (see `writer.cosignature_collector`)
  .lock                      held by the one writer
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CHECKPOINT",
    "COSIGNED",
    "HISTORY",
    "LOCK",
    "WAL",
    "cosigned_path",
    "history_path",
    "list_cosigned",
    "list_history",
]

CHECKPOINT = "checkpoint"
HISTORY = "checkpoints"
WAL = "wal"
COSIGNED = "cosigned"
LOCK = ".lock"


def history_path(directory: Path, size: int) -> Path:
    return directory / HISTORY / f"{size:020d}"


def list_history(directory: Path) -> list[tuple[int, Path]]:
    """History checkpoints as (size from the file name, path), smallest first."""
    return _by_size(directory / HISTORY)


def cosigned_path(directory: Path, size: int) -> Path:
    return directory / COSIGNED / f"{size:020d}"


def list_cosigned(directory: Path) -> list[tuple[int, Path]]:
    """Witness-cosigned checkpoints as (size from the file name, path), smallest first."""
    return _by_size(directory / COSIGNED)


def _by_size(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = [
        (int(path.name), path)
        for path in folder.iterdir()
        if path.name.isdecimal() and len(path.name) == 20
    ]
    return sorted(found)
