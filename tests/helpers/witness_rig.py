"""A real provenance log with the checkpoints it signed, a witness over it (fixtures
`real_log` and `witness`), the keys both sign with, and small tools the witness tests share."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance import Checkpoint, ProvenanceLog, open_checkpoint
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.merkle import consistency_proof
from gateway.provenance.formats.tiles import TileReader
from gateway.provenance.testing import log_request, seeded_signer
from gateway.provenance.witness.witness import Witness, WitnessError

__all__ = [
    "COSIGNER",
    "LOG_SIGNER",
    "NOW",
    "ORIGIN",
    "WITNESS_SIGNER",
    "RealLog",
    "Refusal",
    "answer_once",
    "cosign_up_to",
    "make_log",
    "open_witness",
    "real_log",
    "witness",
]


ORIGIN = "gateway.example/log/replica-1"


LOG_SIGNER = seeded_signer(ORIGIN)


WITNESS_SIGNER = seeded_signer("witness.example/w1")


COSIGNER = Cosigner(WITNESS_SIGNER)


NOW = 1_767_225_600  # 2026-01-01T00:00:00Z


@dataclass
class RealLog:
    """A provenance log written by `ProvenanceLog`, with the checkpoints it signed."""

    directory: Path
    notes: list[bytes]  # in order; sizes 0, 2, 6, 10

    @property
    def sizes(self) -> list[int]:
        return [self.checkpoint(i).size for i in range(len(self.notes))]

    def checkpoint(self, number: int) -> Checkpoint:
        return open_checkpoint(self.notes[number], [LOG_SIGNER.verifier()]).checkpoint

    def proof(self, old: int, new: int) -> list[bytes]:
        if not 0 < old < new:
            return []
        return consistency_proof(old, new, TileReader(self.directory, new).node)


def make_log(directory: Path, *, tenants: tuple[str, str, str] = ("acme-app",) * 3) -> RealLog:
    """A log of three checkpoints after the empty one, of 1, 2 and 2 requests (two records
    each), whose requests are `tenants`' (one for each checkpoint's requests)."""

    async def build() -> list[bytes]:
        log = await ProvenanceLog.open(directory, ORIGIN, LOG_SIGNER)
        first = log.latest_checkpoint()
        assert first is not None
        notes = [first.note]
        number = 0
        for count, tenant in zip((1, 2, 2), tenants, strict=True):
            for _ in range(count):
                await log_request(log, number, tenant=tenant)
                number += 1
            notes.append((await log.checkpoint()).note)
        await log.close()
        return notes

    return RealLog(directory, asyncio.run(build()))


@pytest.fixture(scope="module")
def real_log(tmp_path_factory: pytest.TempPathFactory) -> RealLog:
    """Written once: the tests only read it (each witness gets its own state)."""
    return make_log(tmp_path_factory.mktemp("log"))


def open_witness(path: Path, clock: float = NOW, *, new: bool = True) -> Witness:
    """The test witness on the state file `path`: a new one, or (`new=False`) reopened."""
    return Witness.open(path, COSIGNER, [LOG_SIGNER.verifier()], clock=lambda: clock, new=new)


@pytest.fixture
def witness(tmp_path: Path) -> Iterator[Witness]:
    with open_witness(tmp_path / "witness.json") as opened:
        yield opened


def cosign_up_to(witness: Witness, log: RealLog, last: int) -> None:
    """Have `witness` cosign `log`'s checkpoints 0..`last` in order."""
    old = 0
    for number in range(last + 1):
        size = log.sizes[number]
        witness.add_checkpoint(old, log.proof(old, size), log.notes[number])
        old = size


class Refusal:
    """`with Refusal("conflict") as caught:` expects a WitnessError with that code."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.error: WitnessError | None = None

    def __enter__(self) -> Refusal:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: Any, tb: Any) -> bool:
        assert isinstance(error, WitnessError), f"expected WitnessError({self.code}), got {error!r}"
        assert error.code == self.code, f"expected {self.code}, got {error.code}: {error}"
        self.error = error
        return True


async def answer_once(reply: bytes) -> tuple[asyncio.Server, str]:
    """A one-shot HTTP server that sends `reply` (status line, headers, body) as is."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/prefix/"
