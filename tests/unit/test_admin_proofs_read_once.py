"""The admin API's request records (`GET /admin/v1/log/requests/{id}`, auditor) prove the
bytes they show.

Before, `_records` found the request's records in one reading of the log directory and
put a second reading of their entry bundle into each proof's extra line. The directory is
the operator's, who may swap a bundle between the two readings: the auditor was shown a
record no checkpoint covers (another backend, another status) beside a proof that
verified, of the genuine one. Now each record is proved from the very bytes it was parsed
from (`LogDirectory.find_request_entries`), so a swapped reading is shown with a proof
that fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import gateway.admin.requests as requests
from gateway.admin.requests import _records
from gateway.canonical import canonical_json
from gateway.errors import GatewayError
from gateway.provenance import TlogProof
from gateway.provenance.audit.proof import check_tlog_proof
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.errors import ProvenanceError
from gateway.provenance.formats.records import parse_record
from gateway.provenance.testing import seeded_signer, write_requests

ORIGIN = "gateway.example/log/admin-read-once"
SIGNER = seeded_signer(ORIGIN)
FORGED_BACKEND = "gpu-elsewhere"


def _logged(path: Path) -> None:
    write_requests(path, ORIGIN, SIGNER, 3)


def _swapping(swapped: int) -> Callable[[Path], LogDirectory]:
    """A LogDirectory whose entry bundle, on reading number `swapped` (1 the first), says
    req-1's dispatch went to another backend: replaced and put back between readings."""

    class Swaps(LogDirectory):
        readings = 0

        def bundle(self, index: int, size: int) -> list[bytes]:
            entries = list(super().bundle(index, size))
            Swaps.readings += 1
            if Swaps.readings == swapped:
                for number, entry in enumerate(entries):
                    record: dict[str, Any] = orjson.loads(entry)
                    if record["request_id"] == "req-1" and record["type"] == "dispatch":
                        record["backend"]["id"] = FORGED_BACKEND
                        entries[number] = canonical_json(record)
                        parse_record(entries[number])  # well formed, only not the logged one
            return entries

    return Swaps


def _proves(proof: str) -> bool:
    try:
        check_tlog_proof(proof.encode(), [SIGNER.verifier()], origin=ORIGIN, now=time.time())
    except ProvenanceError:
        return False
    return True


def test_the_records_shown_are_the_bytes_proved(tmp_path: Path) -> None:
    _logged(tmp_path / "log")
    genuine = _records(tmp_path / "log", "req-1")
    assert [r.type for r in genuine.records] == ["dispatch", "completion"]
    assert all(_proves(r.proof) for r in genuine.records)
    assert genuine.records[0].record["backend"]["id"] != FORGED_BACKEND


@pytest.mark.parametrize("swapped", [1, 2])
def test_a_bundle_swapped_between_readings_is_never_shown_as_proved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swapped: int
) -> None:
    _logged(tmp_path / "log")
    monkeypatch.setattr(requests, "LogDirectory", _swapping(swapped))
    try:
        found = _records(tmp_path / "log", "req-1")
    except GatewayError:  # a refusal is fine; an unproved record shown is not
        return
    for shown in found.records:
        extra = TlogProof.parse(shown.proof).extra
        assert extra is not None and orjson.loads(extra) == shown.record, (
            "the record shown is not the one its proof carries"
        )
        if shown.record.get("backend", {}).get("id") == FORGED_BACKEND:
            assert not _proves(shown.proof)  # the swapped bytes: no checkpoint covers them
