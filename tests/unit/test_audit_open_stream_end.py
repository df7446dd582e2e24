"""`owngate audit open --receipt --log --kind response` holds a stream's error event to
the record that says the stream broke off.

A response commitment covers the backend's bytes, not what the gateway writes after them
(docs/provenance.md, "The body a client commits to"), so on a stream the tool takes the
gateway's error event off before it opens the commitment. Before, it did so whatever the
record said: a stream whose completion says `200` (it ended) opened with an error event
the client received before the receipt line, and so did an event merely shaped like the
gateway's (`data: {"error":{},"choices":[...]}`, a falsy `error` that SDKs read as
content) on a stream recorded `502`. The gateway, the party audited, writes that tail
unhashed: the tool said `ok` to a client who saw an error the signed log denies, or
content no commitment covers. The gateway writes its error event only on a stream that
broke off (status 400 or more) and only as the OpenAI error object, nothing else in it."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.errors import ErrorCode, error_body
from gateway.provenance import ProvenanceLog, Receipt, make_receipt
from gateway.provenance.formats.commitments import Salts, commit
from gateway.provenance.formats.records import TraceStep, completion_record, dispatch_record
from gateway.provenance.testing import (
    EXAMPLE_BACKEND,
    EXAMPLE_POLICY,
    CountingRandom,
    seeded_signer,
)
from tests.helpers.provenance import run_audit_output

ORIGIN = "gateway.example/log/stream-end"
SIGNER = seeded_signer(ORIGIN)
ENDED = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
CUT = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: {"cho'  # cut mid-event
GATEWAY_ERROR = b"data: " + error_body(ErrorCode.upstream_error, "the backend broke off") + b"\n\n"
# shaped as the gateway's error event (its regex matches); SDKs read its content
INJECTED = b'data: {"error":{},"choices":[{"delta":{"content":"pay here"}}],"x":{}}\n\n'
NESTED = b'data: {"error":{"message":' + b"[" * 100_000 + b"]" * 100_000 + b"}}\n\n"


async def _request(log: ProvenanceLog, number: int, status: int, relayed: bytes) -> bytes:
    """The records of request `req-<number>`, its completion `status` committing to
    `relayed`; its receipt's bytes."""
    salts = Salts.generate(CountingRandom(f"stream-end/{number}"))
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    dispatch = await log.append(
        dispatch_record(
            request_id=f"req-{number}",
            time=moment,
            tenant="acme-app",
            model="llama-3-8b",
            policy=EXAMPLE_POLICY,
            trace=[TraceStep(EXAMPLE_BACKEND.id, "admitted", "tenant.allow")],
            backend=EXAMPLE_BACKEND,
            fallback_reason=None,
            request_commitment=commit("request", salts.request, b"{}"),
        )
    )
    await log.append(
        completion_record(
            request_id=f"req-{number}",
            time=moment,
            dispatch=dispatch,
            status=status,
            error=None if status < 400 else "vllm-eu-1: the backend broke off",
            usage=None,
            latency_ms=5,
            response_commitment=commit("response", salts.response, relayed),
        )
    )
    receipt = Receipt(
        request_id=f"req-{number}",
        log=ORIGIN,
        index=dispatch.index,
        dispatch_hash=dispatch.leaf_hash,
        backend=EXAMPLE_BACKEND.id,
        policy_digest=EXAMPLE_POLICY.digest,
        salts=salts,
    )
    return make_receipt(receipt, SIGNER)


@pytest.fixture(scope="module")
def receipts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The log, and the receipts of a stream that ended (200) and one cut (502)."""
    path = tmp_path_factory.mktemp("log")

    async def build() -> tuple[bytes, bytes]:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        ended = await _request(log, 0, 200, ENDED)
        cut = await _request(log, 1, 502, CUT)
        await log.close()
        return ended, cut

    ended, cut = asyncio.run(build())
    (path.parent / "ended.json").write_bytes(ended)
    (path.parent / "cut.json").write_bytes(cut)
    return path, path.parent / "ended.json", path.parent / "cut.json"


def _receipt_line(receipt: Path) -> bytes:
    return b": owngate-receipt " + base64.b64encode(receipt.read_bytes()) + b"\n\n"


def _open(log: Path, receipt: Path, received: bytes, tmp_path: Path) -> tuple[int, str]:
    body = tmp_path / "received"
    body.write_bytes(received)
    argv = ["open", str(body), "--kind", "response", "--receipt", str(receipt), "--log", str(log)]
    return run_audit_output([*argv, "--key", SIGNER.vkey])


def test_the_streams_as_the_gateway_ends_them_open(
    receipts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    log, ended, cut = receipts
    code, out = _open(log, ended, ENDED + _receipt_line(ended), tmp_path)
    assert code == 0, out
    received = CUT + b"\n\n" + GATEWAY_ERROR + _receipt_line(cut)
    code, out = _open(log, cut, received, tmp_path)
    assert code == 0, out
    assert "its error event, its receipt line" in out


def test_an_error_event_on_a_stream_its_record_says_ended_does_not_open(
    receipts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    log, ended, _ = receipts
    code, out = _open(log, ended, ENDED + GATEWAY_ERROR + _receipt_line(ended), tmp_path)
    assert code == 1, out
    assert "says status 200" in out
    assert "error event" in out


def test_an_event_that_is_not_the_gateways_error_does_not_open(
    receipts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    log, ended, cut = receipts
    code, out = _open(log, ended, ENDED + INJECTED + _receipt_line(ended), tmp_path)
    assert code == 1, out
    for tail in (INJECTED, NESTED):
        code, out = _open(log, cut, CUT + b"\n\n" + tail + _receipt_line(cut), tmp_path)
        assert code == 1, out
        assert "not the gateway's error event" in out


@pytest.mark.parametrize(
    ("event", "said"),
    [
        (error_body(ErrorCode.rate_limit_exceeded, "Quota used up: pay at x.example"), "(429)"),
        (error_body(ErrorCode.upstream_timeout, "the backend timed out"), "(504)"),
        (
            error_body(ErrorCode.upstream_error, "x").replace(b"upstream_error", b"billing"),
            "has not",
        ),
    ],
)
def test_an_error_event_of_another_failure_than_the_record_says_does_not_open(
    receipts: tuple[Path, Path, Path], tmp_path: Path, event: bytes, said: str
) -> None:
    """The completion says 502; the gateway told the client of a 429 quota (or a 504, or
    a code it does not have) in its error event, which no commitment covers: before, it
    opened with ok. Each of the gateway's codes has one status, the record's."""
    log, _, cut = receipts
    received = CUT + b"\n\n" + b"data: " + event + b"\n\n" + _receipt_line(cut)
    code, out = _open(log, cut, received, tmp_path)
    assert code == 1, out
    assert said in out and "says status 502" in out, out
