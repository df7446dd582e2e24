"""A reopened log goes on only from its newest signed checkpoint, never from less.

`LogStore.open` recovers from the history files (`checkpoints/`); these tests damage the
directory the way a crash or lost files leave it and check that the log either repairs
what a crash explains or refuses to sign a tree that does not extend the published one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.provenance.errors import LogCorruptedError
from gateway.provenance.formats.layout import CHECKPOINT, HISTORY, cosigned_path, list_history
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.wal import encode_frame
from gateway.provenance.testing import seeded_signer
from gateway.provenance.writer.store import LogStore

ORIGIN = "gateway.example/log/recovery"
SIGNER = seeded_signer(ORIGIN)


def _append(store: LogStore, count: int) -> None:
    entries = [f'{{"n":{store.size + n}}}'.encode() for n in range(count)]
    pairs = [(entry, leaf_hash(entry)) for entry in entries]
    store.append_frames(pairs, b"".join(encode_frame(e, h) for e, h in pairs))


def _log_of_sizes(directory: Path, *sizes: int) -> list[bytes]:
    """A closed log with a checkpoint at each of `sizes`; returns their notes, in order."""
    store = LogStore.open(directory, ORIGIN, [SIGNER])
    notes = []
    try:
        for size in sizes:
            _append(store, size - store.size)
            notes.append(store.checkpoint().note)
    finally:
        store.close()
    return notes


def test_a_crash_before_the_checkpoint_file_was_replaced_is_repaired(tmp_path: Path) -> None:
    # export writes the history file, then the checkpoint file: a crash between the two
    # left the older checkpoint served, and a reopened log that had nothing new to sign
    # kept it there, so the log looked rolled back to anyone reading `checkpoint`.
    older, newest = _log_of_sizes(tmp_path, 3, 7)
    (tmp_path / CHECKPOINT).write_bytes(older)
    LogStore.open(tmp_path, ORIGIN, [SIGNER]).close()
    assert (tmp_path / CHECKPOINT).read_bytes() == newest  # what `audit verify` requires


def test_a_lost_history_is_not_a_new_empty_log(tmp_path: Path) -> None:
    _log_of_sizes(tmp_path, 5)
    shutil.rmtree(tmp_path / HISTORY)
    served = (tmp_path / CHECKPOINT).read_bytes()
    with pytest.raises(LogCorruptedError, match="history is missing"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])
    assert (tmp_path / CHECKPOINT).read_bytes() == served  # not replaced by a size-0 one
    (tmp_path / CHECKPOINT).unlink()
    with pytest.raises(LogCorruptedError, match="history is missing"):  # the tiles remain
        LogStore.open(tmp_path, ORIGIN, [SIGNER])


def test_a_lost_newest_history_file_is_not_a_rollback(tmp_path: Path) -> None:
    _log_of_sizes(tmp_path, 3, 7)
    newest = list_history(tmp_path)[-1][1]
    newest.unlink()
    with pytest.raises(LogCorruptedError, match="size 7, but checkpoints/ ends at size 3"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])


def test_a_cosigned_size_beyond_the_history_is_not_a_rollback(tmp_path: Path) -> None:
    # The witnesses hold a larger tree than the log would go on from: signing new
    # entries from size 3 would fork the log they cosigned.
    _, newest = _log_of_sizes(tmp_path, 3, 7)
    cosigned = cosigned_path(tmp_path, 7)
    cosigned.parent.mkdir()
    cosigned.write_bytes(newest)
    list_history(tmp_path)[-1][1].unlink()
    (tmp_path / CHECKPOINT).write_bytes(list_history(tmp_path)[-1][1].read_bytes())
    with pytest.raises(LogCorruptedError, match="cosigned/ holds a checkpoint of size 7"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])
