"""Files the log writer, the witness and the attestation sidecar read back are read as
the admin API serves them: a regular file, bounded, opened without waiting. Before, each
was a plain `read_bytes()`: a FIFO at the newest history checkpoint, the checkpoint file,
a cosigned checkpoint, the witness state or the sidecar's counter file blocked the
process for ever, starting or running. Now it is refused at once, as a damaged file is:
the writer does not start (LogCorruptedError), a cosignature is not stored (retried),
the witness does not start (MalformedError), the sidecar does not start (ValueError)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gateway.attest.notary import CounterFile
from gateway.provenance.errors import LogCorruptedError, MalformedError
from gateway.provenance.formats.layout import CHECKPOINT, cosigned_path, list_history
from gateway.provenance.formats.merkle import HASH_SIZE, leaf_hash
from gateway.provenance.formats.wal import encode_frame
from gateway.provenance.testing import seeded_signer
from gateway.provenance.witness import state as witness_state
from gateway.provenance.witness.state import TreeHead, WitnessState
from gateway.provenance.writer.cosignature_collector import _write_merged
from gateway.provenance.writer.store import LogStore
from tests.helpers.fifo_guard import call_guarded

ORIGIN = "gateway.example/log/fifos"
SIGNER = seeded_signer(ORIGIN)


def _log(directory: Path) -> bytes:
    """A closed log of 3 entries; its checkpoint note."""
    store = LogStore.open(directory, ORIGIN, [SIGNER])
    try:
        entries = [b'{"n":%d}' % n for n in range(3)]
        pairs = [(entry, leaf_hash(entry)) for entry in entries]
        store.append_frames(pairs, b"".join(encode_frame(e, h) for e, h in pairs))
        return store.checkpoint().note
    finally:
        store.close()


def _fifo_in_place(path: Path) -> Path:
    path.unlink(missing_ok=True)
    path.parent.mkdir(exist_ok=True)  # cosigned/: made by the first cosignature stored
    os.mkfifo(path)
    return path


def _open_log(directory: Path) -> None:
    LogStore.open(directory, ORIGIN, [SIGNER]).close()


def test_a_fifo_as_the_newest_history_checkpoint_stops_the_writer_at_once(
    tmp_path: Path,
) -> None:
    _log(tmp_path)
    fifo = _fifo_in_place(list_history(tmp_path)[-1][1])
    raised = call_guarded(lambda: _open_log(tmp_path), fifo)
    assert isinstance(raised, LogCorruptedError), raised
    assert "not a regular file" in str(raised)


def test_a_fifo_as_the_checkpoint_file_stops_the_writer_at_once(tmp_path: Path) -> None:
    _log(tmp_path)
    fifo = _fifo_in_place(tmp_path / CHECKPOINT)
    raised = call_guarded(lambda: _open_log(tmp_path), fifo)
    assert isinstance(raised, LogCorruptedError), raised
    assert "not a regular file" in str(raised)


def test_a_fifo_as_a_cosigned_checkpoint_fails_the_store_at_once(tmp_path: Path) -> None:
    note = _log(tmp_path)
    fifo = _fifo_in_place(cosigned_path(tmp_path, 3))
    store = lambda: _write_merged(tmp_path, fifo, note, note)  # noqa: E731
    raised = call_guarded(store, fifo)
    assert isinstance(raised, MalformedError), raised  # counted as a failure, retried
    assert fifo.is_fifo()  # nothing written over what the collector could not read


def test_a_fifo_as_the_witness_state_stops_the_witness_at_once(tmp_path: Path) -> None:
    fifo = _fifo_in_place(tmp_path / "state.json")
    raised = call_guarded(lambda: WitnessState.open(fifo).close(), fifo)
    assert isinstance(raised, MalformedError), raised
    assert "not a witness state file" in str(raised)


def test_the_witness_never_writes_a_state_it_would_not_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    with WitnessState.open(path, new=True) as state:
        before = path.read_bytes()
        monkeypatch.setattr(witness_state, "MAX_STATE_FILE", len(before) + 10)
        with pytest.raises(OSError, match="larger than") as refused:
            state.update(ORIGIN, TreeHead(1, bytes(HASH_SIZE)))
        assert refused.value.errno == errno.EFBIG
        assert state.get(ORIGIN) is None  # unchanged, in memory and on disk
    assert path.read_bytes() == before


def test_a_fifo_as_the_counter_file_stops_the_sidecar_at_once(tmp_path: Path) -> None:
    fifo = _fifo_in_place(tmp_path / "attest-counter")
    raised = call_guarded(lambda: CounterFile(fifo).read(), fifo)
    assert isinstance(raised, ValueError), raised
    assert "does not hold a counter" in str(raised)
