"""`owngate audit receipt verify --log --backend-key`: the backend's countersignature a
receipt carries must be the one the log's completion record accepted for that answer.

The countersignature sits beside the log's signature in a receipt (the log does not sign
it), so a receipt can carry any statement the backend's key ever signed for the request
id: another answer's (a second dispatch of the same request, or one the gateway swapped
for a different answer to the client). The completion record is what the client's bytes
open (`audit open --receipt`), so the two must name the same statement.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.errors import ErrorCode, error_body
from gateway.provenance import ProvenanceLog, Receipt, Salts, commit, make_receipt
from gateway.provenance.formats.attestation import (
    Attestation,
    Statement,
    open_countersignature,
    sign_statement,
)
from gateway.provenance.formats.receipts import attach_countersignature
from gateway.provenance.formats.records import (
    TraceStep,
    completion_record,
    dispatch_record,
)
from gateway.provenance.testing import (
    EXAMPLE_BACKEND,
    EXAMPLE_POLICY,
    CountingRandom,
    seeded_signer,
)

LOG = seeded_signer("example.com/log")
BACKEND = seeded_signer("gpu-host")
SALTS = Salts.generate(CountingRandom("countersigned"))
REQUEST = b'{"model":"m","messages":[]}'
SERVED = b'{"choices":[{"message":{"content":"served"}}]}'
OTHER = b'{"choices":[{"message":{"content":"something else"}}]}'
MOMENT = datetime(2026, 1, 1, tzinfo=UTC)


def _dispatch() -> dict[str, object]:
    """The dispatch of request req-1 to the example backend, as the gateway writes it."""
    return dispatch_record(
        request_id="req-1",
        time=MOMENT,
        tenant="acme",
        model="m",
        policy=EXAMPLE_POLICY,
        trace=[TraceStep(EXAMPLE_BACKEND.id, "admitted", "tenant.allow")],
        backend=EXAMPLE_BACKEND,
        fallback_reason=None,
        request_commitment=commit("request", SALTS.request, REQUEST),
    )


def _statement(counter: int, response: bytes) -> Statement:
    return Statement(
        "req-1",
        "2026-01-01T00:00:00.100Z",
        counter,
        str(BACKEND),
        commit("request", SALTS.request, REQUEST),
        commit("response", SALTS.response, response),
    )


def _log(
    path: Path, accepted: Attestation | None, served: bytes = SERVED, status: int = 200
) -> Receipt:
    """A log holding one request (to an attested backend) whose completion recorded
    `accepted`, `status` and a response commitment to `served`."""

    async def build() -> Receipt:
        log = await ProvenanceLog.open(path, LOG.name, LOG)
        dispatch = await log.append(_dispatch())
        await log.append(
            completion_record(
                request_id="req-1",
                time=MOMENT,
                dispatch=dispatch,
                status=status,
                error=None,
                usage=None,
                latency_ms=100,
                response_commitment=commit("response", SALTS.response, served),
                attestation=accepted,
            )
        )
        await log.close()
        return Receipt(
            "req-1",
            LOG.name,
            dispatch.index,
            dispatch.leaf_hash,
            EXAMPLE_BACKEND.id,
            EXAMPLE_POLICY.digest,
            SALTS,
        )

    return asyncio.run(build())


def _accepted(statement: Statement) -> Attestation:
    return Attestation.accepted(open_countersignature(sign_statement(statement, BACKEND)))


def _verify(tmp_path: Path, receipt: Receipt, carried: Statement) -> int:
    envelope = attach_countersignature(make_receipt(receipt, LOG), sign_statement(carried, BACKEND))
    path = tmp_path / "receipt.json"
    path.write_bytes(envelope)
    return main(
        [
            "audit",
            "receipt",
            "verify",
            str(path),
            "--key",
            LOG.vkey,
            "--log",
            str(tmp_path / "log"),
            "--backend-key",
            f"{EXAMPLE_BACKEND.id}={BACKEND.vkey}",
        ]
    )


def test_the_countersignature_the_log_recorded_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    genuine = _statement(7, SERVED)
    receipt = _log(tmp_path / "log", _accepted(genuine))
    assert _verify(tmp_path, receipt, genuine) == 0
    assert "ok: entry 1, its completion, recorded this countersignature" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "carried",
    [
        _statement(8, OTHER),  # the backend's statement about another answer
        _statement(8, SERVED),  # the same bytes, another statement (a replay)
    ],
    ids=["another-answer", "another-counter"],
)
def test_a_countersignature_the_log_did_not_record_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], carried: Statement
) -> None:
    receipt = _log(tmp_path / "log", _accepted(_statement(7, SERVED)))
    assert _verify(tmp_path, receipt, carried) == 1
    assert "accepted the receipt's countersignature" in capsys.readouterr().err


def test_a_countersignature_the_log_refused_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway recorded `mismatch` (the backend signed other bytes than the client
    got) yet handed the client that countersignature: the receipt must not pass as a
    two-party statement."""
    receipt = _log(tmp_path / "log", Attestation(str(BACKEND), failure="mismatch"))
    assert _verify(tmp_path, receipt, _statement(7, OTHER)) == 1
    assert "accepted the receipt's countersignature" in capsys.readouterr().err


def test_a_countersignature_over_another_request_body_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    receipt = _log(tmp_path / "log", _accepted(_statement(7, SERVED)))
    other = Statement(
        "req-1",
        "2026-01-01T00:00:00.100Z",
        7,
        str(BACKEND),
        commit("request", SALTS.request, b'{"model":"m","messages":["x"]}'),
        commit("response", SALTS.response, SERVED),
    )
    assert _verify(tmp_path, receipt, other) == 1
    assert "countersigned request commitment differs" in capsys.readouterr().err


def test_a_dispatch_whose_completion_is_not_checkpointed_yet_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the dispatch is in the log (the completion comes after the answer): the
    countersignature cannot be checked yet, which is a failure, named as such."""

    async def build() -> Receipt:
        log = await ProvenanceLog.open(tmp_path / "log", LOG.name, LOG)
        dispatch = await log.append(_dispatch())
        await log.close()
        return Receipt(
            "req-1",
            LOG.name,
            dispatch.index,
            dispatch.leaf_hash,
            EXAMPLE_BACKEND.id,
            EXAMPLE_POLICY.digest,
            SALTS,
        )

    assert _verify(tmp_path, asyncio.run(build()), _statement(7, SERVED)) == 1
    assert "holds no completion of entry 0 yet" in capsys.readouterr().err


def _response_check(tmp_path: Path, carried: Statement, received: bytes, *keys: str) -> int:
    """`receipt verify --response` without the log: what a client alone can check."""
    receipt = Receipt(
        "req-1", LOG.name, 0, bytes(32), EXAMPLE_BACKEND.id, EXAMPLE_POLICY.digest, SALTS
    )
    envelope = attach_countersignature(make_receipt(receipt, LOG), sign_statement(carried, BACKEND))
    (tmp_path / "receipt.json").write_bytes(envelope)
    (tmp_path / "received").write_bytes(received)
    argv = ["audit", "receipt", "verify", str(tmp_path / "receipt.json"), "--key", LOG.vkey]
    return main([*argv, *keys, "--response", str(tmp_path / "received")])


KEY = ("--backend-key", f"{EXAMPLE_BACKEND.id}={BACKEND.vkey}")


def test_the_client_checks_its_own_bytes_against_the_countersignature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _response_check(tmp_path, _statement(7, SERVED), SERVED, *KEY) == 0
    assert "the backend countersigned" in capsys.readouterr().out
    # a countersignature over another answer, for the same request: its bytes do not open it
    assert _response_check(tmp_path, _statement(8, OTHER), SERVED, *KEY) == 1
    assert "is not the response the backend countersigned" in capsys.readouterr().err


def test_a_stream_as_received_is_checked_without_the_gateways_receipt_line(
    tmp_path: Path,
) -> None:
    stream = b'data: {"choices":[]}\n\ndata: [DONE]\n\n'
    received = stream + b": owngate-receipt " + base64.b64encode(b"{}") + b"\n\n"
    assert _response_check(tmp_path, _statement(7, stream), received, *KEY) == 0
    changed = received.replace(b"choices", b"chOices")
    assert _response_check(tmp_path, _statement(7, stream), changed, *KEY) == 1


def test_the_response_check_needs_the_backends_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _response_check(tmp_path, _statement(7, SERVED), SERVED) == 2
    assert "give --backend-key" in capsys.readouterr().err


def test_a_countersignature_checked_by_no_key_is_pointed_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --backend-key the countersignature a receipt carries is not read: the
    verdict is the log's alone, and the output says so (it printed the same `ok` lines
    as for a receipt without one, which an auditor could take for a two-party check)."""
    genuine = _statement(7, SERVED)
    receipt = _log(tmp_path / "log", _accepted(genuine))
    envelope = attach_countersignature(make_receipt(receipt, LOG), sign_statement(genuine, BACKEND))
    (tmp_path / "receipt.json").write_bytes(envelope)
    argv = ["audit", "receipt", "verify", str(tmp_path / "receipt.json"), "--key", LOG.vkey]
    assert main([*argv, "--log", str(tmp_path / "log")]) == 0
    out = capsys.readouterr().out
    assert "note: the receipt carries a countersignature, not checked" in out, out
    assert f"--backend-key {EXAMPLE_BACKEND.id}=VKEY" in out
    (tmp_path / "plain.json").write_bytes(make_receipt(receipt, LOG))
    assert (
        main(["audit", "receipt", "verify", str(tmp_path / "plain.json"), "--key", LOG.vkey]) == 0
    )
    assert "countersignature" not in capsys.readouterr().out
    backend = f"{EXAMPLE_BACKEND.id}={BACKEND.vkey}"
    assert main([*argv, "--backend-key", backend]) == 0
    assert "not checked" not in capsys.readouterr().out


def test_events_after_a_countersigned_stream_do_not_open_it(tmp_path: Path) -> None:
    """A countersigned stream is whole (the sidecar signs no stream that broke off), so
    the gateway writes nothing after it but its receipt line: no error event, no line end
    (the sidecar's comment started a line). An event a gateway put after the backend's
    bytes, shaped as the error event it writes after a broken stream but carrying
    content an SSE client reads as the answer's, is not what the backend countersigned."""
    stream = b'data: {"choices":[]}\n\ndata: [DONE]\n\n'
    receipt_line = b": owngate-receipt " + base64.b64encode(b"{}") + b"\n\n"
    assert _response_check(tmp_path, _statement(7, stream), stream + receipt_line, *KEY) == 0
    injected = b'data: {"error":{},"choices":[{"delta":{"content":"pay here"}}],"x":{}}\n\n'
    received = stream + injected + receipt_line
    assert _response_check(tmp_path, _statement(7, stream), received, *KEY) == 1


def test_a_backend_key_for_another_backend_than_the_receipts_is_pointed_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A client that gives the key of the backend it expected, and gets a receipt naming
    another (a hosted fallback, a look-alike id), is told that nothing was countersigned:
    the exit status alone (0: the receipt is the log's) would read as a two-party check."""
    receipt = Receipt(
        "req-1", LOG.name, 0, bytes(32), EXAMPLE_BACKEND.id, EXAMPLE_POLICY.digest, SALTS
    )
    (tmp_path / "receipt.json").write_bytes(make_receipt(receipt, LOG))
    argv = ["audit", "receipt", "verify", str(tmp_path / "receipt.json"), "--key", LOG.vkey]
    assert main([*argv, "--backend-key", f"gpu-expected={BACKEND.vkey}"]) == 0
    out = capsys.readouterr().out
    assert f"note: the receipt names backend {EXAMPLE_BACKEND.id}, for which no" in out, out
    assert "gpu-expected given" in out
    assert main([*argv, *KEY]) == 1  # its own backend's key: no countersignature, refused


def _opens(tmp_path: Path, receipt: Receipt, received: bytes, carried: Statement | None) -> int:
    """`audit open --kind response --receipt --log` with the bytes a client received, and
    a receipt carrying `carried` (or no countersignature)."""
    envelope = make_receipt(receipt, LOG)
    if carried is not None:
        envelope = attach_countersignature(envelope, sign_statement(carried, BACKEND))
    (tmp_path / "receipt.json").write_bytes(envelope)
    (tmp_path / "received").write_bytes(received)
    argv = ["audit", "open", str(tmp_path / "received"), "--kind", "response"]
    argv += ["--receipt", str(tmp_path / "receipt.json"), "--log", str(tmp_path / "log")]
    return main([*argv, "--key", LOG.vkey])


STREAM = b'data: {"choices":[]}\n\ndata: [DONE]\n\n'
RECEIPT_LINE = b": owngate-receipt " + base64.b64encode(b"{}") + b"\n\n"
# shaped as the gateway's error event after a broken stream; SDKs read its content
INJECTED = b'data: {"error":{},"choices":[{"delta":{"content":"pay here"}}],"x":{}}\n\n'


@pytest.mark.parametrize("carried", [True, False], ids=["receipt-carries-it", "log-only"])
def test_audit_open_opens_a_countersigned_stream_only_as_received_less_the_receipt_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], carried: bool
) -> None:
    """What `receipt verify --response-body` checks, `audit open --receipt` checks too: a
    countersigned answer is whole, so an event after the backend's bytes (the stripped
    error-event form, which the log's completion of a broken stream may open) is not part
    of the answer the log's commitment covers. The log's completion says the answer was
    countersigned, whether or not the receipt still carries the countersignature."""
    genuine = _statement(7, STREAM)
    receipt = _log(tmp_path / "log", _accepted(genuine), STREAM)
    statement = genuine if carried else None
    assert _opens(tmp_path, receipt, STREAM + RECEIPT_LINE, statement) == 0
    assert "opens the response commitment" in capsys.readouterr().out
    assert _opens(tmp_path, receipt, STREAM + INJECTED + RECEIPT_LINE, statement) == 1
    assert "FAILED" in capsys.readouterr().err


def test_audit_open_still_takes_the_error_event_off_an_answer_not_countersigned(
    tmp_path: Path,
) -> None:
    """A stream that broke off (never countersigned) ends with the gateway's error event,
    which its commitment does not cover: that form still opens it."""
    broken = b'data: {"choices":[]}\n\n'
    error = b"data: " + error_body(ErrorCode.upstream_error, "the backend broke off") + b"\n\n"
    # no attestation, and one the gateway refused (`sig` null): neither is countersigned
    for where, recorded in (
        ("none", None),
        ("refused", Attestation(str(BACKEND), failure="missing")),
    ):
        receipt = _log(tmp_path / where / "log", recorded, broken, status=502)
        assert _opens(tmp_path / where, receipt, broken + error + RECEIPT_LINE, None) == 0
