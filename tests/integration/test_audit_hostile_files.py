"""`owngate audit verify` of a log directory whose files the audited operator made hostile.

The auditor reads a directory the operator handed over (a tarball, a shared volume): any
file in it may be a FIFO (a read waits for a writer for ever), a symlink to `/dev/zero`
(a read never ends and grows without bound) or a sparse file of many gigabytes (read
whole into memory). Each is a failed check naming the file, in a real `owngate`
process whose address space is capped: before, the audit hung or died of MemoryError.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from gateway.provenance import LogSettings, ProvenanceLog, load_verifiers
from gateway.provenance.audit.verify import verify_log
from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.layout import CHECKPOINT, list_cosigned, list_history
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.tiles import entries_path, tile_path
from gateway.provenance.formats.wal import encode_frame
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import owngate_argv
from tests.helpers.provenance import socket_in_place

ORIGIN = "gateway.example/log/hostile-files"
SIGNER = seeded_signer(ORIGIN)
ADDRESS_SPACE = 2 << 30  # bytes: the audit's process fits in far less, /dev/zero does not
HANG_GUARD_S = 60  # only a hung audit gets near this: it is a failure, not a measure


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        settings = LogSettings(group_commit_ms=0, checkpoint_every=4)
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER, settings=settings)
        for n in range(3):
            await log_request(log, n)
            await log.exports_idle()
        await log_request(log, 3)  # two entries past the last checkpoint: the wal
        await log.abort()  # a crash: no final checkpoint

    asyncio.run(build())
    return path


@pytest.fixture
def copy(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "log"
    shutil.copytree(pristine, target)
    return target


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _audit(log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        owngate_argv("audit", "verify", str(log), "--key", SIGNER.vkey),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=HANG_GUARD_S,
        preexec_fn=_cap_memory,
        check=False,
    )


def _size(log: Path) -> int:
    return list_history(log)[-1][0]


def _name(log: Path, which: str) -> str:
    size = _size(log)
    return {
        "checkpoint": CHECKPOINT,
        "history": f"checkpoints/{list_history(log)[0][1].name}",
        "tile": tile_path(0, 0, size),
        "bundle": entries_path(0, size),
        "wal": f"wal/{next((log / 'wal').iterdir()).name}",
    }[which]


def test_the_log_as_built_verifies(copy: Path) -> None:
    done = _audit(copy)
    assert done.returncode == 0, done.stderr
    assert list((copy / "wal").iterdir()), "the log has entries past its checkpoint"


@pytest.mark.parametrize("which", ["checkpoint", "history", "tile", "bundle", "wal"])
def test_a_fifo_in_place_of_a_log_file_is_refused(copy: Path, which: str) -> None:
    name = _name(copy, which)
    (copy / name).unlink()
    os.mkfifo(copy / name)
    done = _audit(copy)
    assert done.returncode == 1, done.stderr
    assert "FAILED" in done.stderr and "not a regular file" in done.stderr
    assert name.rpartition("/")[2] in done.stderr


@pytest.mark.parametrize("which", ["checkpoint", "history", "tile", "bundle", "wal"])
def test_a_symlink_loop_in_place_of_a_log_file_is_refused_as_a_fifo_is(
    copy: Path, which: str
) -> None:
    # Before: exit 2 (a usage error) with a bare "[Errno 40] Too many levels of symbolic
    # links" where a FIFO in the same place was a failed check naming the file.
    name = _name(copy, which)
    (copy / name).unlink()
    (copy / name).symlink_to((copy / name).name)  # itself
    done = _audit(copy)
    assert done.returncode == 1, done.stderr
    assert "FAILED" in done.stderr and "Too many levels of symbolic links" in done.stderr
    assert "Errno" not in done.stderr, done.stderr
    assert name.rpartition("/")[2] in done.stderr


@pytest.mark.parametrize("which", ["checkpoint", "history", "tile", "bundle", "wal"])
def test_a_socket_in_place_of_a_log_file_is_refused_as_a_fifo_is(copy: Path, which: str) -> None:
    # Before: exit 2 (a usage error) with a bare "[Errno 6] No such device or address".
    name = _name(copy, which)
    socket_in_place(copy / name)
    done = _audit(copy)
    assert done.returncode == 1, done.stderr
    assert "FAILED" in done.stderr and "No such device or address" in done.stderr
    assert "Errno" not in done.stderr, done.stderr
    assert name.rpartition("/")[2] in done.stderr


@pytest.mark.parametrize("which", ["checkpoint", "history", "tile", "bundle"])
def test_a_symlink_to_dev_zero_is_refused(copy: Path, which: str) -> None:
    name = _name(copy, which)
    (copy / name).unlink()
    (copy / name).symlink_to("/dev/zero")
    done = _audit(copy)
    assert done.returncode == 1, done.stderr
    assert "FAILED" in done.stderr and "not a regular file" in done.stderr


@pytest.mark.parametrize("which", ["checkpoint", "tile", "bundle", "wal"])
def test_a_sparse_file_of_gigabytes_is_not_read_whole(copy: Path, which: str) -> None:
    name = _name(copy, which)
    with (copy / name).open("r+b") as file:
        file.truncate(0)
        file.truncate(64 << 30)  # sparse: no disk used, but read_bytes() allocates it all
    done = _audit(copy)
    assert "MemoryError" not in done.stderr
    if which == "wal":  # its frames are read one by one: the first, all zeroes, is torn
        assert done.returncode == 0, done.stderr
        assert " 0 entries not yet in a checkpoint" in done.stdout
        return
    assert done.returncode == 1, done.stderr
    assert "FAILED" in done.stderr and "larger than" in done.stderr


@pytest.mark.parametrize("verb", ["verify", "prove"])
def test_a_fifo_among_the_cosigned_checkpoints_is_refused(copy: Path, verb: str) -> None:
    # verify given a witness key and prove --cosigned read cosigned/; a FIFO there
    # waited for a writer.
    (copy / "cosigned").mkdir(exist_ok=True)
    os.mkfifo(copy / "cosigned" / f"{_size(copy):020d}")
    assert list_cosigned(copy)
    witness = Cosigner(seeded_signer("witness.example/w1")).vkey
    argv = {
        "verify": ("verify", str(copy), "--key", SIGNER.vkey, "--witness-key", witness),
        "prove": ("prove", str(copy), "req-0", "--cosigned"),
    }[verb]
    done = subprocess.run(
        owngate_argv("audit", *argv),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=HANG_GUARD_S,
        preexec_fn=_cap_memory,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "not a regular file" in done.stderr


def test_a_segment_of_many_frames_is_checked_one_at_a_time(copy: Path) -> None:
    # Frames that hash right but hold no record (an empty entry: 34 bytes each) after
    # the real ones: the first is a failed check. Before, every frame of the segment was
    # held (a tuple and two bytes objects, ~4x the file) before any was checked, so a
    # segment of gigabytes exhausted memory; now none is kept past its check.
    frames = 200_000
    frame = encode_frame(b"", leaf_hash(b""))
    with (copy / _name(copy, "wal")).open("ab") as file:
        file.write(frame * frames)
    verifiers = load_verifiers([SIGNER.vkey])
    tracemalloc.start()
    try:
        with pytest.raises(LogVerificationError, match="not a valid schema-v1 record"):
            verify_log(copy, verifiers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(frame) * frames // 2, f"{peak} bytes held at the peak"
