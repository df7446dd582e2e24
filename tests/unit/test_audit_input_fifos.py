"""Files an auditor names on the command line (a file of `--key`s, a `--checkpoint` or
`--attest-checkpoint` saved earlier; also through OWNGATE_AUDIT_*) are read as the log's
own files are: a regular file, bounded, opened without waiting. Before, a FIFO there (a
path typed wrong, a process substitution) blocked `audit verify`, `receipt verify` and
`report` for ever, and `/dev/zero` was read until memory ran out. Now each is a usage
error (exit 2) naming the file: not a regular file, or larger than 1 MiB."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.provenance import ProvenanceLog
from gateway.provenance.formats.receipts import make_receipt
from gateway.provenance.testing import log_request, seeded_signer

HANG_GUARD_S = 30  # only a blocked open or an endless read gets near this: a failure
LOG = seeded_signer("fifos.example/log")
SIDECAR = seeded_signer("fifos.example/sidecar")


def _log(tmp_path: Path) -> tuple[str, str]:
    async def write() -> bytes:
        log = await ProvenanceLog.open(tmp_path / "log", LOG.name, LOG)
        logged = await log_request(log, 1)
        await log.close()
        return make_receipt(logged.receipt, LOG)

    receipt = tmp_path / "receipt.json"
    receipt.write_bytes(asyncio.run(write()))
    return str(tmp_path / "log"), str(receipt)


def _commands(logdir: str, receipt: str, fifo: str) -> dict[str, list[str]]:
    key = ["--key", LOG.vkey]
    report = ["--json", os.devnull]
    sidecar = ["--backend-key", f"vllm-eu-1={SIDECAR.vkey}", "--attest-checkpoint"]
    return {
        "verify --key FILE": ["audit", "verify", logdir, "--key", fifo],
        "receipt verify --key FILE": ["audit", "receipt", "verify", receipt, "--key", fifo],
        "verify --witness-key FILE": ["audit", "verify", logdir, *key, "--witness-key", fifo],
        "verify --checkpoint": ["audit", "verify", logdir, *key, "--checkpoint", fifo],
        "report --checkpoint": ["audit", "report", logdir, *key, *report, "--checkpoint", fifo],
        "verify --attest-checkpoint": [
            "audit",
            "verify",
            logdir,
            *key,
            *sidecar,
            f"vllm-eu-1={fifo}",
        ],
    }


COMMANDS = list(_commands("L", "R", "F"))


def _run_guarded(argv: list[str], fifo: Path | None) -> int | None:
    """main(argv) on a thread; None when it did not return within the guard (each blocked
    open of the FIFO, a key file is read more than once, is then released by opening its
    writing end, so no thread is left behind)."""
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(main(argv)), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    if not thread.is_alive():
        return outcome[0] if outcome else None
    for _ in range(1000):  # bounded: a handful of opens each wait for a writer
        if fifo is None or not thread.is_alive():
            break
        with contextlib.suppress(OSError):  # ENXIO: no open is waiting right now
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(0.05)
    return None


@pytest.mark.parametrize("command", COMMANDS)
def test_a_fifo_named_as_an_audit_input_is_refused_not_waited_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    logdir, receipt = _log(tmp_path)
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    code = _run_guarded(_commands(logdir, receipt, str(fifo))[command], fifo)
    assert code is not None, f"{command} blocked opening a FIFO"
    assert code == 2
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_larger_than_its_kind_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # what stands for /dev/zero here (read without end before): a sparse 64 MiB file, read
    # whole before, refused by its size now
    logdir, receipt = _log(tmp_path)
    large = tmp_path / "input"
    with large.open("wb") as file:
        file.truncate(64 << 20)
    assert main(_commands(logdir, receipt, str(large))[command]) == 2
    assert "larger than 1048576 bytes" in capsys.readouterr().err
