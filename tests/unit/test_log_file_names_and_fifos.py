"""Files of a log directory an audited operator handed over: a write-ahead segment is
opened without waiting (a FIFO swapped in after any check would block the open for a
writer for ever), and only ASCII-digit names count as checkpoints or segments."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.layout import history_path, list_cosigned, list_history
from gateway.provenance.formats.wal import list_segments, scan_segment, segment_path

HANG_GUARD_S = 30  # only a blocked open gets near this: a failure, not a measure


def test_a_fifo_segment_is_refused_at_its_open_not_waited_on(tmp_path: Path) -> None:
    fifo = segment_path(tmp_path, 0)
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def scan() -> None:
        try:
            scan_segment(fifo, 0)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    thread = threading.Thread(target=scan, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    blocked = thread.is_alive()
    if blocked:  # release the open waiting for a writer, so no thread is left behind
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join()
    assert not blocked, "scan_segment blocked opening a FIFO"
    assert isinstance(outcome[0], MalformedError)
    assert "not a regular file" in str(outcome[0])


# U+0660..U+0669 and U+FF10..U+FF19: str.isdecimal() and int() take them
_ARABIC_FIVE = "\u0660" * 19 + "\u0665"
_FULLWIDTH_FIVE = "\uff10" * 19 + "\uff15"


@pytest.mark.parametrize("name", [_ARABIC_FIVE, _FULLWIDTH_FIVE])
def test_only_ascii_digit_names_are_checkpoints_or_segments(tmp_path: Path, name: str) -> None:
    genuine = history_path(tmp_path, 5)
    genuine.parent.mkdir()
    genuine.write_bytes(b"note")
    (genuine.parent / name).write_bytes(b"another note for size 5")
    (tmp_path / "cosigned").mkdir()
    (tmp_path / "cosigned" / name).write_bytes(b"x")
    (tmp_path / "wal").mkdir()
    segment_path(tmp_path / "wal", 5).write_bytes(b"")
    (tmp_path / "wal" / f"{name}.wal").write_bytes(b"")
    assert list_history(tmp_path) == [(5, genuine)]
    assert list_cosigned(tmp_path) == []
    assert list_segments(tmp_path / "wal") == [(5, segment_path(tmp_path / "wal", 5))]
