"""A countersignature a gateway's log carries is checked whatever the status of its
completion (`audit verify --backend-key`): the gateway also keeps the one it accepted for
a stream whose client left as its end went out (499) or that a drain cut (503), so a
record of an error status can carry one, and it is a claim about the backend like any
other. A forged, borrowed or replayed one there fails the audit, and one missing from the
sidecar's log fails the cross-check (docs/provenance.md, layer 3)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.provenance import (
    LogVerificationError,
    ProvenanceLog,
    Salts,
    Signer,
    commit,
    verify_log,
)
from gateway.provenance.audit.attested import check_attestations, cross_check
from gateway.provenance.formats.attestation import (
    Attestation,
    Statement,
    open_countersignature,
    sign_statement,
)
from gateway.provenance.formats.records import completion_record, dispatch_record
from gateway.provenance.testing import (
    EXAMPLE_BACKEND,
    EXAMPLE_POLICY,
    CountingRandom,
    seeded_signer,
)

GATEWAY = seeded_signer("gw.test/any-status")
SIDECAR = seeded_signer("gpu.test/any-status")
OTHER = seeded_signer("gpu.test/another")
BACKEND = EXAMPLE_BACKEND.id
REQUEST, RESPONSE = b'{"model":"m","messages":[]}', b"data: [DONE]\n\n"
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _statement(counter: int, request_id: str, salts: Salts) -> Statement:
    return Statement(
        request_id,
        "2026-01-01T00:00:00.000Z",
        counter,
        str(SIDECAR),
        commit("request", salts.request, REQUEST),
        commit("response", salts.response, RESPONSE),
    )


def _accepted(statement: Statement, signer: Signer = SIDECAR) -> Attestation:
    return Attestation.accepted(open_countersignature(sign_statement(statement, signer)))


async def _write(path: Path, answers: list[tuple[Statement, int, Attestation]]) -> None:
    """Each answer dispatched to the example backend and completed with its status and
    the attestation given (as a compromised gateway writes it: whatever it likes)."""
    log = await ProvenanceLog.open(path, GATEWAY.name, GATEWAY)
    try:
        for number, (statement, status, attestation) in enumerate(answers):
            moment = EPOCH + timedelta(seconds=number)
            dispatch = await log.append(
                dispatch_record(
                    request_id=statement.request_id,
                    time=moment,
                    tenant="acme-app",
                    model="m",
                    policy=EXAMPLE_POLICY,
                    trace=[],
                    backend=EXAMPLE_BACKEND,
                    fallback_reason=None,
                    request_commitment=statement.request_commitment,
                )
            )
            await log.append(
                completion_record(
                    request_id=statement.request_id,
                    time=moment,
                    dispatch=dispatch,
                    status=status,
                    error=None if status < 400 else "client closed the request",
                    usage=None,
                    latency_ms=1,
                    response_commitment=statement.response_commitment,
                    attestation=attestation,
                )
            )
    finally:
        await log.close()


def _statements(count: int) -> list[Statement]:
    made = []
    for counter in range(count):
        salts = Salts.generate(CountingRandom(f"any-status/{counter}"))
        made.append(_statement(counter, f"req_{counter:024x}", salts))
    return made


def _check(tmp_path: Path, answers: list[tuple[Statement, int, Attestation]]) -> None:
    asyncio.run(_write(tmp_path / "log", answers))
    verified = verify_log(tmp_path / "log", [GATEWAY.verifier()])
    check_attestations(
        tmp_path / "log", verified.size, {BACKEND: SIDECAR.verifier()}, root=verified.root
    )


def test_a_genuine_countersignature_on_a_record_of_a_client_that_left_passes(
    tmp_path: Path,
) -> None:
    first, second = _statements(2)
    answers = [(first, 200, _accepted(first)), (second, 499, _accepted(second))]
    asyncio.run(_write(tmp_path / "log", answers))
    verified = verify_log(tmp_path / "log", [GATEWAY.verifier()])
    summary = check_attestations(
        tmp_path / "log", verified.size, {BACKEND: SIDECAR.verifier()}, root=verified.root
    )
    assert summary.answers == {BACKEND: 1}  # the answer of status 200; the 499 is no answer
    assert set(summary.statements[str(SIDECAR)]) == {0, 1}


def test_a_countersignature_borrowed_from_another_request_fails_on_an_error_record(
    tmp_path: Path,
) -> None:
    first, second = _statements(2)
    # the second record carries the first request's countersignature (counter 0's time,
    # key and signature), under its own request id and commitments
    borrowed = _accepted(first)
    with pytest.raises(LogVerificationError, match="does not verify"):
        _check(tmp_path, [(first, 200, _accepted(first)), (second, 499, borrowed)])


def test_a_countersignature_by_another_key_fails_on_an_error_record(tmp_path: Path) -> None:
    (first,) = _statements(1)
    foreign = Statement(
        first.request_id,
        first.time,
        first.counter,
        str(OTHER),
        first.request_commitment,
        first.response_commitment,
    )
    with pytest.raises(LogVerificationError, match="not by backend"):
        _check(tmp_path, [(first, 503, _accepted(foreign, OTHER))])


def test_a_counter_used_again_on_an_error_record_is_a_replay(tmp_path: Path) -> None:
    first, second = _statements(2)
    again = Statement(
        second.request_id,
        second.time,
        first.counter,  # the counter of the first, freshly signed (as a rogue key holder)
        second.key,
        second.request_commitment,
        second.response_commitment,
    )
    with pytest.raises(LogVerificationError, match="replayed"):
        _check(tmp_path, [(first, 200, _accepted(first)), (again, 499, _accepted(again))])


def test_a_countersignature_on_an_error_record_must_be_in_the_sidecars_log(
    tmp_path: Path,
) -> None:
    first, second = _statements(2)
    answers = [(first, 200, _accepted(first)), (second, 499, _accepted(second))]
    asyncio.run(_write(tmp_path / "log", answers))

    async def sidecar(statements: list[Statement]) -> None:
        log = await ProvenanceLog.open(tmp_path / "sidecar", SIDECAR.name, SIDECAR)
        try:
            for statement in statements:
                await log.append(statement.record())
        finally:
            await log.close()

    asyncio.run(sidecar([first]))  # the 499's statement is not in it
    verified = verify_log(tmp_path / "log", [GATEWAY.verifier()])
    summary = check_attestations(
        tmp_path / "log", verified.size, {BACKEND: SIDECAR.verifier()}, root=verified.root
    )
    with pytest.raises(LogVerificationError, match="missing from the sidecar's log"):
        cross_check(summary, tmp_path / "sidecar", BACKEND, SIDECAR.verifier())
