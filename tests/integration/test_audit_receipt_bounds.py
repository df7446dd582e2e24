"""`owngate audit receipt verify --log` and the admin API's cosignatures view, against a
log whose `checkpoints/` or `cosigned/` the audited operator padded with names.

Both need one file of the folder (the first checkpoint covering a receipt's entry; the
newest cosigned checkpoint), so neither may hold a listing that grows with the folder:
memory is measured with tracemalloc's peak against the number of names, never a time.
`receipt verify` also stops past `--max-checkpoints` names, as `audit verify` does.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.admin.cosignatures import _read as read_cosignatures
from gateway.provenance import (
    LogSettings,
    ProvenanceLog,
    load_verifiers,
    make_receipt,
    verify_receipt,
)
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.receipt_keys import check_receipt_key
from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.layout import cosigned_path, history_path, list_history
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import owngate_argv

ORIGIN = "gateway.example/log/receipt-bounds"
SIGNER = seeded_signer(ORIGIN)
WITNESS = Cosigner(seeded_signer("witness.example/w1"))
PADDING_FILES = 20_000  # empty files named as checkpoints: what a listing would hold
LISTING_BYTES = PADDING_FILES * 200  # ~ the (int, Path) pairs of a whole listing
HANG_GUARD_S = 120  # only a hung audit gets near this: it is a failure, not a measure


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A small log, and the receipt of its first request."""
    path = tmp_path_factory.mktemp("log")
    envelopes: list[bytes] = []

    async def build() -> None:
        settings = LogSettings(group_commit_ms=0, checkpoint_every=2)
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER, settings=settings)
        for n in range(2):
            logged = await log_request(log, n)
            envelopes.append(make_receipt(logged.receipt, SIGNER))
            await log.exports_idle()
        await log.close()

    asyncio.run(build())
    return path, envelopes[0]


@pytest.fixture
def copy(pristine: tuple[Path, bytes], tmp_path: Path) -> tuple[Path, bytes]:
    target = tmp_path / "log"
    shutil.copytree(pristine[0], target)
    return target, pristine[1]


def _peak(call: Callable[[], object]) -> tuple[int, BaseException | None]:
    """tracemalloc's peak while `call()` runs, and the LogVerificationError it raised."""
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


def _pad(folder_path: Callable[[Path, int], Path], log: Path, count: int) -> None:
    newest = list_history(log)[-1][0]
    folder_path(log, 0).parent.mkdir(exist_ok=True)
    for n in range(count):
        folder_path(log, newest + 1000 + n).touch()


def test_receipt_key_check_holds_no_listing_of_checkpoints(copy: tuple[Path, bytes]) -> None:
    log, envelope = copy
    verifiers = load_verifiers([SIGNER.vkey])
    receipt = verify_receipt(envelope, verifiers)
    _pad(history_path, log, PADDING_FILES)
    peak, raised = _peak(lambda: check_receipt_key(LogDirectory(log), envelope, receipt, verifiers))
    assert raised is None  # the covering checkpoint is the real one, below the padding
    assert peak < LISTING_BYTES // 8, peak
    peak, raised = _peak(
        lambda: check_receipt_key(LogDirectory(log), envelope, receipt, verifiers, 100)
    )
    assert isinstance(raised, LogVerificationError)
    assert "more than 100 checkpoint files" in str(raised)
    assert "--max-checkpoints" in str(raised)
    assert peak < LISTING_BYTES // 8, peak


def test_receipt_verify_cli_takes_max_checkpoints(copy: tuple[Path, bytes], tmp_path: Path) -> None:
    log, envelope = copy
    receipt_file = tmp_path / "receipt.json"
    receipt_file.write_bytes(envelope)
    _pad(history_path, log, 5)

    def audit(*flags: str) -> subprocess.CompletedProcess[str]:
        argv = owngate_argv(
            "audit", "receipt", "verify", str(receipt_file), "--key", SIGNER.vkey,
            "--log", str(log), *flags,
        )  # fmt: skip
        return subprocess.run(
            argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=HANG_GUARD_S
        )

    low = audit("--max-checkpoints", "3")
    assert low.returncode == 1, low.stderr
    assert "more than 3 checkpoint files" in low.stderr
    high = audit("--max-checkpoints", "100")
    assert high.returncode == 0, high.stderr


def test_cosignatures_view_holds_no_listing_of_cosigned(copy: tuple[Path, bytes]) -> None:
    log, _ = copy
    _pad(cosigned_path, log, PADDING_FILES)
    verifiers = load_verifiers([SIGNER.vkey])
    peak, raised = _peak(lambda: read_cosignatures(log, verifiers, [WITNESS.vkey], {}))
    assert raised is None
    assert peak < LISTING_BYTES // 8, peak
    found = read_cosignatures(log, verifiers, [WITNESS.vkey], {})
    # The newest name is the one read (an empty file: no valid cosignature in it).
    assert found["witnesses"][0]["valid"] is False
