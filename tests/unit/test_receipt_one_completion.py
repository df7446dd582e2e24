"""A receipt's dispatch has one completion: the receipt checks refuse a log holding two.

`owngate audit receipt verify --log` judges the receipt's answer by the completion of its
dispatch: an error status that accepted no countersignature needs none
(`uncountersigned_error`), a countersignature the receipt carries must be the one a
completion accepted (`check_countersignature_in_log`), and `audit open --receipt` opens
the completion's response commitment (`receipt_commitment`). `audit verify` refuses a
completion linking to a dispatch already completed (`audit.links`); the receipt checks
took the first completion that suited them, or any. So a gateway that had the attested
backend's countersigned answer (its completion recorded, as the sidecar's own log shows)
and handed the client other bytes with no countersignature wrote a second completion,
status 502, before it: `receipt verify --backend-key --log` said the answer was an
error, which no backend countersigns, and passed. Now a second completion of the
receipt's dispatch fails each check, naming both entries.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.provenance import ProvenanceLog
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.receipt import (
    check_countersignature_in_log,
    check_receipt_in_log,
    receipt_commitment,
    uncountersigned_error,
)
from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.attestation import Attestation, statement_of_records
from gateway.provenance.formats.commitments import Salts, commit
from gateway.provenance.formats.receipts import Receipt
from gateway.provenance.formats.records import (
    TraceStep,
    Usage,
    completion_record,
    dispatch_record,
    parse_record,
)
from gateway.provenance.testing import (
    EXAMPLE_BACKEND,
    EXAMPLE_POLICY,
    CountingRandom,
    seeded_signer,
)

ORIGIN = "gateway.example/log/one-completion"
SIGNER = seeded_signer(ORIGIN)
SIDECAR = seeded_signer("gpu.example/attest")
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def _countersigned() -> Attestation:
    return Attestation(
        str(SIDECAR.verifier()), 7, "2026-01-01T00:00:01.000Z", base64.b64encode(bytes(64)).decode()
    )


def _logged(path: Path, first: int, *, first_commits: bool = True) -> Receipt:
    """One dispatch completed twice: with status `first` and no countersignature, then
    with 200 and an accepted one. The receipt of the dispatch, carrying none."""

    async def build() -> Receipt:
        salts = Salts.generate(CountingRandom("one-completion"))
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        dispatch = await log.append(
            dispatch_record(
                request_id="req-0",
                time=WHEN,
                tenant="acme-app",
                model="llama-3-8b",
                policy=EXAMPLE_POLICY,
                trace=[TraceStep(EXAMPLE_BACKEND.id, "admitted", "tenant.allow")],
                backend=EXAMPLE_BACKEND,
                fallback_reason=None,
                request_commitment=commit("request", salts.request, b"{}"),
            )
        )
        for status, attestation, body in (
            (first, None, b"other bytes" if first_commits else None),
            (200, _countersigned(), b'{"choices":[]}'),
        ):
            await log.append(
                completion_record(
                    request_id="req-0",
                    time=WHEN,
                    dispatch=dispatch,
                    status=status,
                    error=None if status < 400 else f"{EXAMPLE_BACKEND.id}: status {status}",
                    usage=Usage(1, 1, 2),
                    latency_ms=1,
                    response_commitment=None
                    if body is None
                    else commit("response", salts.response, body),
                    attestation=attestation,
                )
            )
        await log.close()
        return Receipt(
            request_id="req-0",
            log=ORIGIN,
            index=dispatch.index,
            dispatch_hash=dispatch.leaf_hash,
            backend=EXAMPLE_BACKEND.id,
            policy_digest=EXAMPLE_POLICY.digest,
            salts=salts,
        )

    return asyncio.run(build())


def test_an_error_completion_before_a_countersigned_one_is_refused(tmp_path: Path) -> None:
    receipt = _logged(tmp_path / "log", 502)
    log = LogDirectory(tmp_path / "log")
    proved = check_receipt_in_log(log, receipt, [SIGNER.verifier()])
    with pytest.raises(LogVerificationError, match="entries 1 and 2 both complete entry 0"):
        uncountersigned_error(log, receipt, proved)


def test_a_countersignature_is_refused_beside_a_second_completion(tmp_path: Path) -> None:
    receipt = _logged(tmp_path / "log", 502)
    log = LogDirectory(tmp_path / "log")
    proved = check_receipt_in_log(log, receipt, [SIGNER.verifier()])
    _, _, second = log.find_request_entries("req-0", proved.size)
    statement = statement_of_records(parse_record(proved.entry).data, second[2].data)
    assert statement is not None  # the second completion accepted it
    with pytest.raises(LogVerificationError, match="entries 1 and 2 both complete entry 0"):
        check_countersignature_in_log(log, receipt, statement[0], proved)


def test_a_response_commitment_is_refused_beside_a_second_completion(tmp_path: Path) -> None:
    receipt = _logged(tmp_path / "log", 502, first_commits=False)
    log = LogDirectory(tmp_path / "log")
    with pytest.raises(LogVerificationError, match="entries 1 and 2 both complete entry 0"):
        receipt_commitment(log, receipt, "response", [SIGNER.verifier()])
