"""`owngate audit receipt verify --log` and `audit open --receipt` judge a completion record
and prove it in the signed checkpoint: the bytes proved must be the bytes judged.

Before, `receipt_commitment`, `check_countersignature_in_log` and
`completion_that_sent_nothing` found the completion in one reading of the log directory
and proved a second reading of its entry bundle. The directory is the audited operator's,
who may swap the bundle between the two readings: the checks then accepted a completion
no checkpoint covers (a response commitment the client's bytes open, a countersignature
the log never accepted, an attempt that "sent nothing" over plain HTTP), and proved the
genuine one. Now each record is proved from the very bytes it was parsed from, so a
swapped reading fails the proof.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.canonical import canonical_json
from gateway.provenance import ProvenanceLog
from gateway.provenance.audit.pinned import sent_nothing
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.receipt import (
    check_countersignature_in_log,
    check_receipt_in_log,
    completion_that_sent_nothing,
    receipt_commitment,
)
from gateway.provenance.errors import ProvenanceError
from gateway.provenance.formats.attestation import Attestation, statement_of_records
from gateway.provenance.formats.receipts import Receipt
from gateway.provenance.formats.records import parse_record
from gateway.provenance.formats.tiles import encode_bundle
from gateway.provenance.testing import EXAMPLE_BACKEND, log_request, seeded_signer

ORIGIN = "gateway.example/log/read-once"
SIGNER = seeded_signer(ORIGIN)
SIDECAR = seeded_signer("gpu.example/attest")
FORGED_COMMITMENT = "ab" * 32


class SwapsOneReading(LogDirectory):
    """A log directory whose entry bundle, on reading number `swapped` (1 the first),
    holds the entries `change` made (every other reading the genuine ones): the files
    replaced and put back between two readings, as the operator under audit can."""

    def __init__(self, path: Path, swapped: int, change: Callable[[list[bytes]], None]):
        super().__init__(path)
        self.swapped, self.change, self.readings = swapped, change, 0

    def bundle(self, index: int, size: int) -> list[bytes]:
        entries = super().bundle(index, size)
        self.readings += 1
        if self.readings == self.swapped:
            entries = list(entries)
            self.change(entries)
            encode_bundle(entries)  # still a bundle the reader takes
        return entries


def _logged(path: Path) -> Receipt:
    """A log of 3 requests, all answered (status 200); the receipt of req-1."""

    async def build() -> Receipt:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        logged = [await log_request(log, number) for number in range(3)]
        await log.close()
        return logged[1].receipt

    return asyncio.run(build())


def _completion_changed(
    receipt: Receipt, change: Callable[[dict[str, Any]], None]
) -> Callable[[list[bytes]], None]:
    """Change the completion of the receipt's dispatch in a reading of the bundle."""

    def swap(entries: list[bytes]) -> None:
        for number, entry in enumerate(entries):
            record = orjson.loads(entry)
            if record["type"] == "completion" and record["dispatch"]["index"] == receipt.index:
                change(record)
                entries[number] = canonical_json(record)
                parse_record(entries[number])  # a well-formed record, only not the logged one

    return swap


def _another_commitment(record: dict[str, Any]) -> None:
    record["response_commitment"] = FORGED_COMMITMENT


def _sent_nothing(record: dict[str, Any]) -> None:
    record.update(status=503, error=f"{EXAMPLE_BACKEND.id}: connect", response_commitment=None)


def _countersigned(record: dict[str, Any]) -> None:
    sig = base64.b64encode(bytes(64)).decode()
    when = "2026-01-01T00:00:01.000Z"
    record["attestation"] = Attestation(str(SIDECAR.verifier()), 7, when, sig).field()


def test_the_response_commitment_proved_is_the_one_read(tmp_path: Path) -> None:
    receipt = _logged(tmp_path / "log")
    genuine = receipt_commitment(
        LogDirectory(tmp_path / "log"), receipt, "response", [SIGNER.verifier()]
    )
    assert genuine.commitment != FORGED_COMMITMENT
    # reading 1: the receipt's dispatch; 2: the search for its completion; 3: (before) it again
    log = SwapsOneReading(tmp_path / "log", 2, _completion_changed(receipt, _another_commitment))
    with pytest.raises(ProvenanceError):
        receipt_commitment(log, receipt, "response", [SIGNER.verifier()])


def test_an_attempt_that_sent_nothing_is_proved_from_the_bytes_read(tmp_path: Path) -> None:
    receipt = _logged(tmp_path / "log")
    proved = check_receipt_in_log(LogDirectory(tmp_path / "log"), receipt, [SIGNER.verifier()])
    backend = EXAMPLE_BACKEND.id
    genuine = LogDirectory(tmp_path / "log")
    assert completion_that_sent_nothing(genuine, receipt, proved, backend) is None  # answered
    log = SwapsOneReading(tmp_path / "log", 1, _completion_changed(receipt, _sent_nothing))
    with pytest.raises(ProvenanceError):
        completion_that_sent_nothing(log, receipt, proved, backend)


def test_a_countersignature_is_matched_to_the_completion_proved(tmp_path: Path) -> None:
    receipt = _logged(tmp_path / "log")
    proved = check_receipt_in_log(LogDirectory(tmp_path / "log"), receipt, [SIGNER.verifier()])
    completion = next(
        record
        for record in map(orjson.loads, LogDirectory(tmp_path / "log").bundle(0, proved.size))
        if record["type"] == "completion" and record["dispatch"]["index"] == receipt.index
    )
    _countersigned(completion)
    # the statement the swapped-in completion says it accepted: a receipt may carry it
    claimed = statement_of_records(parse_record(proved.entry).data, completion)
    assert claimed is not None
    log = SwapsOneReading(tmp_path / "log", 1, _completion_changed(receipt, _countersigned))
    with pytest.raises(ProvenanceError):
        check_countersignature_in_log(log, receipt, claimed[0], proved)


def test_an_answered_completion_never_sent_nothing() -> None:
    """A completion saying its attempt failed before sending and that it answered the
    client (a status below 400) contradicts itself: not an attempt that sent nothing."""
    unsent = {"status": 503, "error": "gpu-a: connect", "response_commitment": None}
    assert sent_nothing(unsent, "gpu-a")
    for status in (200, 204, 399):
        assert not sent_nothing({**unsent, "status": status}, "gpu-a")
    assert not sent_nothing({**unsent, "status": "503"}, "gpu-a")
    no_status = {key: value for key, value in unsent.items() if key != "status"}
    assert not sent_nothing(no_status, "gpu-a")
