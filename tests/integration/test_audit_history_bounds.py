"""`owngate audit verify` of a log whose `checkpoints/` the audited operator padded.

The operator holds the log's key: it can sign a million checkpoints, or checkpoints with
extension lines of most of a megabyte each, and hand the auditor that directory. The audit
lists and holds the history before it checks any root, so it must stop at a limit it names
(`HistoryLimits`, `--max-checkpoints`, `--max-history-bytes`) instead of growing with the
input. Memory is measured with tracemalloc's peak against the input's size, never a time.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from gateway.provenance import LogSettings, ProvenanceLog, load_verifiers
from gateway.provenance.audit.reader import log_state
from gateway.provenance.audit.verify import HistoryLimits, verify_log
from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.checkpoint import Checkpoint, sign_checkpoint
from gateway.provenance.formats.layout import history_path, list_history
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import owngate_argv

ORIGIN = "gateway.example/log/history-bounds"
SIGNER = seeded_signer(ORIGIN)
PADDING_FILES = 20_000  # empty files named as checkpoints: what a listing would hold
PADDING_NOTES = 24  # signed checkpoints with a long extension line each
EXTENSION = 200_000  # characters of each padding note's extension line
HANG_GUARD_S = 120  # only a hung audit gets near this: it is a failure, not a measure


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        settings = LogSettings(group_commit_ms=0, checkpoint_every=2)
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER, settings=settings)
        for n in range(2):
            await log_request(log, n)
            await log.exports_idle()
        await log.close()

    asyncio.run(build())
    return path


@pytest.fixture
def copy(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "log"
    shutil.copytree(pristine, target)
    return target


def _peak(call: object) -> tuple[int, BaseException | None]:
    """tracemalloc's peak while `call()` runs, and what it raised."""
    assert callable(call)
    tracemalloc.start()
    raised: BaseException | None = None
    try:
        call()
    except LogVerificationError as exc:
        raised = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, raised


def test_the_log_as_built_verifies_within_small_limits(copy: Path) -> None:
    summary = verify_log(copy, load_verifiers([SIGNER.vkey]), limits=HistoryLimits(10, 1 << 16))
    assert summary.checkpoints == len(list_history(copy)) <= 10


def test_a_million_checkpoint_names_are_not_held(copy: Path) -> None:
    newest = list_history(copy)[-1][0]
    for n in range(PADDING_FILES):
        history_path(copy, newest + 1000 + n).touch()
    limit = 100
    verifiers = load_verifiers([SIGNER.vkey])
    peak, raised = _peak(lambda: verify_log(copy, verifiers, limits=HistoryLimits(files=limit)))
    assert isinstance(raised, LogVerificationError)
    assert f"more than {limit} checkpoint files" in str(raised)
    assert "--max-checkpoints" in str(raised)
    # The whole listing is ~PADDING_FILES (int, Path) pairs, some 200 bytes each: 4 MB.
    assert peak < PADDING_FILES * 200 // 8, peak
    # Reading which checkpoint is newest (each reading of a live log) keeps no list either.
    peak, raised = _peak(lambda: log_state(copy))
    assert raised is None
    assert peak < PADDING_FILES * 200 // 8, peak


def test_operator_signed_padding_notes_are_not_held_whole(copy: Path) -> None:
    newest = list_history(copy)[-1][0]
    for n in range(PADDING_NOTES):
        size = newest + 1000 + n
        padding = Checkpoint(ORIGIN, size, bytes(32), ("x" * EXTENSION,))
        history_path(copy, size).write_bytes(sign_checkpoint(padding, [SIGNER]))
    given = PADDING_NOTES * EXTENSION
    limit = given // 8
    verifiers = load_verifiers([SIGNER.vkey])
    peak, raised = _peak(lambda: verify_log(copy, verifiers, limits=HistoryLimits(bytes=limit)))
    assert isinstance(raised, LogVerificationError)
    assert f"at most {limit} bytes" in str(raised)
    assert "--max-history-bytes" in str(raised)
    # Each note held is its bytes, its text and its extension line: 3x what was read.
    assert peak < given // 2, (peak, given)


def test_the_cli_names_the_limit_and_takes_a_higher_one(copy: Path) -> None:
    newest = list_history(copy)[-1][0]
    for n in range(5):
        history_path(copy, newest + 1000 + n).touch()

    def audit(*flags: str) -> subprocess.CompletedProcess[str]:
        argv = owngate_argv("audit", "verify", str(copy), "--key", SIGNER.vkey, *flags)
        return subprocess.run(
            argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=HANG_GUARD_S
        )

    low = audit("--max-checkpoints", "3")
    assert low.returncode == 1, low.stderr
    assert "more than 3 checkpoint files" in low.stderr
    assert "--max-checkpoints" in low.stderr
    high = audit("--max-checkpoints", "100")
    assert high.returncode == 1, high.stderr  # past the limit: the empty files are refused
    assert "more than" not in high.stderr
    assert "checkpoints/" in high.stderr
