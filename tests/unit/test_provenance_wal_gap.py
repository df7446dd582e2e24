"""Entries deleted from the write-ahead segments before a checkpoint covered them.

The writer refuses to open such a log (`LogCorruptedError`: a segment starting past the
log's end); `audit verify` and `audit report` used to call it fine, counting the entries
after the gap as "not yet in a checkpoint".
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from gateway.provenance import LogCorruptedError, ProvenanceLog
from gateway.provenance.formats.wal import list_segments
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "test.owngate/wal-gap"
SIGNER = seeded_signer(ORIGIN)


def _crashed_log(path: Path) -> None:
    """One request checkpointed (entries 0-1), three more only in the segment (2-7)."""

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        await log_request(log, 0)
        await log.checkpoint()
        for number in range(1, 4):
            await log_request(log, number)
        await log.abort()  # a crash: no final checkpoint

    asyncio.run(build())


def test_unsigned_entries_after_a_crash_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _crashed_log(tmp_path)
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey]) == 0
    assert "6 entries not yet in a checkpoint" in capsys.readouterr().out


def test_a_gap_in_the_write_ahead_segments_fails_verify_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _crashed_log(tmp_path)
    [(first, segment)] = list_segments(tmp_path / "wal")
    assert first == 2
    segment.rename(segment.with_name(f"{5:020d}.wal"))  # entries 2..4 vanish
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey]) == 1
    assert "entries 2..4 are missing" in capsys.readouterr().err
    report = tmp_path.parent / "report.json"
    code = run_audit(["report", str(tmp_path), "--key", SIGNER.vkey, "--json", str(report)])
    verification = json.loads(report.read_text())["verification"]
    assert code == 1 and verification["ok"] is False and verification["index"] == 2


def _frames(segment: Path) -> list[bytes]:
    """A segment's frames (`uint16 length ‖ record ‖ leaf hash`), each as written."""
    data, frames = segment.read_bytes(), []
    while data:
        size = 2 + int.from_bytes(data[:2], "big") + 32
        frames.append(data[:size])
        data = data[size:]
    return frames


def test_a_frame_taken_out_of_the_write_ahead_segment_fails_verify_before_it_is_signed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each frame checks only itself, so a segment with a whole frame taken out (or a
    record rewritten with its own hash) still reads as entries 2.. in order, and the next
    start replays and signs them: request 1's completion at entry 2 then links to itself
    and the signed log fails `verify`. `verify` passed the segment before that start; it
    now holds the unsigned entries to the record and link checks of the signed ones."""
    _crashed_log(tmp_path)
    [(first, segment)] = list_segments(tmp_path / "wal")
    frames = _frames(segment)
    assert first == 2 and len(frames) == 6
    segment.write_bytes(b"".join(frames[1:]))  # request 1's dispatch (entry 2) taken out
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey]) == 1
    err = capsys.readouterr().err
    assert "entry 2: completion links to entry 2, which is not earlier" in err, err
    assert "not yet in a checkpoint: the next start signs it" in err
    # a record that is not one, in a frame whose hash is its own
    broken = b'{"v":1}'
    segment.write_bytes(
        len(broken).to_bytes(2, "big") + broken + hashlib.sha256(b"\x00" + broken).digest()
    )
    assert run_audit(["verify", str(tmp_path), "--key", SIGNER.vkey]) == 1
    assert "entry 2: not a valid schema-v1 record" in capsys.readouterr().err


def test_the_writer_refuses_to_sign_a_segment_with_a_frame_taken_out(tmp_path: Path) -> None:
    """Recovery replayed such a segment unread and signed it: a checkpoint over request
    1's completion linking to itself at entry 2, a log its own writer made that fails
    `verify`. It is damage, refused at open as damage elsewhere is; an intact segment
    and a torn tail (the last frame cut short) still replay."""
    _crashed_log(tmp_path / "log")
    [(_, segment)] = list_segments(tmp_path / "log" / "wal")
    frames = _frames(segment)
    for name, data, replayed in (
        ("intact", b"".join(frames), 6),
        ("torn", b"".join(frames)[:-7], 5),
        ("taken out", b"".join(frames[1:]), None),
        ("rewritten", b"".join(frames[:1] + frames[2:3] + frames[1:2] + frames[3:]), None),
    ):
        copy = tmp_path / name
        shutil.copytree(tmp_path / "log", copy)
        (copy / "wal" / segment.name).write_bytes(data)

        async def reopen(copy: Path = copy) -> int:
            log = await ProvenanceLog.open(copy, ORIGIN, SIGNER)
            await log.close()
            return log.recovery.replayed

        if replayed is None:
            with pytest.raises(LogCorruptedError, match=r"entry \d in the write-ahead segment"):
                asyncio.run(reopen())
        else:
            assert asyncio.run(reopen()) == replayed
            assert run_audit(["verify", str(copy), "--key", SIGNER.vkey]) == 0
