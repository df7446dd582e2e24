"""A log's history starts with a checkpoint of size 0 (docs/provenance.md, "The log
directory"): an independent verifier walking `checkpoints/` meets it first, and must know
its root (RFC 6962's hash of the empty tree, SHA-256 of no bytes) and that RFC 9162 (and
transparency-dev/merkle, whose vectors call `size1 = 0` an error) defines no consistency
proof from it. The page did not say so: an auditor written from it alone failed the
consistency of every log's first two checkpoints."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path

from gateway.provenance import ProvenanceLog, verify_log
from gateway.provenance.testing import log_request, seeded_signer

SIGNER = seeded_signer("empty-tree.example/log")
EMPTY_ROOT = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="


def test_the_first_checkpoint_is_the_empty_tree_and_audits(tmp_path: Path) -> None:
    async def write() -> None:
        log = await ProvenanceLog.open(tmp_path, SIGNER.name, SIGNER)
        await log_request(log, 1)
        await log.close()

    asyncio.run(write())
    assert base64.b64encode(hashlib.sha256(b"").digest()).decode() == EMPTY_ROOT
    history = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert history[0] == "0" * 20 and len(history) >= 2
    first = (tmp_path / "checkpoints" / history[0]).read_bytes()
    body = first.split(b"\n\n", 1)[0].decode()
    assert body == f"{SIGNER.name}\n0\n{EMPTY_ROOT}"
    # The page's claim: owngate's own audit takes the empty checkpoint as the start.
    assert verify_log(tmp_path, [SIGNER.verifier()]).size == 2
