"""A closed log some of whose checkpoints two witnesses cosigned (fixture `witnessed_log`),
the keys that signed it, and a copy to tamper with: shared by the cosigning and
witness-state tests."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from gateway.provenance import ProvenanceLog
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.testing import log_request, seeded_signer
from gateway.provenance.witness.witness import Witness
from gateway.provenance.writer.cosignature_collector import cosigned_path

__all__ = ["LOG_SIGNER", "ORIGIN", "W1", "W2", "copy_log", "witnessed_log"]

ORIGIN = "gateway.example/log/cosigned"
LOG_SIGNER = seeded_signer(ORIGIN)
W1 = Cosigner(seeded_signer("witness.example/w1"))
W2 = Cosigner(seeded_signer("witness.example/w2", seed=2))


@pytest.fixture(scope="module")
def witnessed_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed log whose checkpoints of size 4 and 8 are cosigned by W1 (8 also by W2)."""
    logdir = tmp_path_factory.mktemp("witnessed")
    states = tmp_path_factory.mktemp("states")
    w1 = Witness.open(states / "w1.json", W1, [LOG_SIGNER.verifier()], new=True)
    w2 = Witness.open(states / "w2.json", W2, [LOG_SIGNER.verifier()], new=True)

    async def build() -> None:
        log = await ProvenanceLog.open(logdir, ORIGIN, LOG_SIGNER)
        old = 0
        for first in (0, 2):
            for n in range(first, first + 2):
                await log_request(log, n)
            signed = await log.checkpoint()
            size = signed.checkpoint.size
            proof = await log.consistency_proof(old, size) if old else []
            path = cosigned_path(logdir, size)
            path.parent.mkdir(exist_ok=True)
            lines = w1.add_checkpoint(old, proof, signed.note)
            if size == 8:
                lines += w2.add_checkpoint(0, [], signed.note)
            path.write_bytes(signed.note + lines)
            old = size
        await log_request(log, 9)  # one more request, not witnessed
        await log.close()

    try:
        asyncio.run(build())
    finally:
        w1.close()
        w2.close()
    return logdir


def copy_log(log: Path, tmp_path: Path) -> Path:
    """A copy of the log directory `log` under `tmp_path` (its lock file left out)."""
    copy = tmp_path / "copy"
    shutil.copytree(log, copy, ignore=shutil.ignore_patterns(".lock"))
    return copy
