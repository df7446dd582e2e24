"""Artefact fields with a documented form are refused out of it, so a verifier never
shows them: a receipt's request id, log and backend, a record's request id, a checkpoint's
origin (and the gateway's own `provenance.origin`). docs/provenance.md gives each form;
tests/unit/test_audit_hostile_text.py covers what is shown of the free-form ones."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from gateway.provenance import (
    MalformedError,
    ProvenanceLog,
    RecordError,
    make_receipt,
    parse_record,
    verify_receipt,
)
from gateway.provenance.formats.checkpoint import Checkpoint, open_checkpoint
from gateway.provenance.formats.note import sign_note
from gateway.provenance.testing import log_request, seeded_signer
from gateway.provenance.writer.preflight import preflight
from tests.helpers.provenance import run_audit

ORIGIN = "gateway.example/log/forms"
SIGNER = seeded_signer(ORIGIN)


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A log of one request, and its genuine receipt."""
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        first = await log_request(log, 0)
        (path.parent / "receipt.json").write_bytes(make_receipt(first.receipt, SIGNER))
        await log.close()

    asyncio.run(build())
    return path, path.parent / "receipt.json"


def _forged_receipt(logged: tuple[Path, Path], tmp_path: Path, field: str, value: str) -> Path:
    """Request 0's receipt with `field` set to `value`, signed by the log's own key: what
    a compromised gateway can hand a client."""
    _path, genuine = logged
    receipt = verify_receipt(genuine.read_bytes(), [SIGNER.verifier()])
    forged = dataclasses.replace(
        receipt,
        request_id=value if field == "request_id" else receipt.request_id,
        log=value if field == "log" else receipt.log,
        backend=value if field == "backend" else receipt.backend,
    )
    out = tmp_path / "forged.json"
    out.write_bytes(make_receipt(forged, SIGNER))
    return out


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("request_id", "req-0\x1b[2K\rok: receipt for request req-9 signed by the log x"),
        ("request_id", "req-0\nok: forged"),
        ("request_id", "req-0\u202e"),
        ("request_id", "r" * 129),
        ("log", ORIGIN + "\x1b[8m"),
        ("log", ORIGIN + "\u2028ok: forged"),
        ("backend", "gpu\x9b2K"),
    ],
)
@pytest.mark.parametrize("verb", ["receipt", "proof"])
def test_a_receipt_field_not_in_its_form_does_not_verify(
    logged: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    field: str,
    value: str,
    verb: str,
) -> None:
    receipt = _forged_receipt(logged, tmp_path, field, value)
    if verb == "receipt":
        argv = ["receipt", "verify", str(receipt), "--key", SIGNER.vkey]
    else:  # the proof file does not matter: the receipt is refused first
        argv = ["proof", "verify", str(tmp_path / "none"), "--key", SIGNER.vkey]
        argv += ["--receipt", str(receipt)]
    assert run_audit(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"FAILED: receipt {field} ") and err.count("\n") == 1, err
    assert err[:-1].isprintable()  # the value is not printed


def test_the_genuine_receipt_still_verifies(
    logged: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _path, receipt = logged
    assert run_audit(["receipt", "verify", str(receipt), "--key", SIGNER.vkey]) == 0
    assert "ok: receipt for request req-0 of the log " + ORIGIN in capsys.readouterr().out


@pytest.mark.parametrize("request_id", ["req 1", "req-1\x1b[2K", "req-1\u202e", "", "r" * 129])
def test_a_record_whose_request_id_is_not_in_its_form_does_not_parse(request_id: str) -> None:
    entry = (
        '{"dispatch":{"hash":"' + "0" * 64 + '","index":0},"error":null,"latency_ms":1,'
        '"request_id":' + json.dumps(request_id) + ',"response_commitment":null,'
        '"status":200,"time":"2026-01-01T00:00:00.000Z","type":"completion","usage":null,"v":1}'
    ).encode()
    with pytest.raises(RecordError, match="request_id"):
        parse_record(entry)


def test_a_plain_request_id_parses() -> None:
    entry = (
        '{"dispatch":{"hash":"' + "0" * 64 + '","index":0},"error":null,"latency_ms":1,'
        '"request_id":"req_0123456789abcdef01234567","response_commitment":null,'
        '"status":200,"time":"2026-01-01T00:00:00.000Z","type":"completion","usage":null,"v":1}'
    ).encode()
    assert parse_record(entry).request_id == "req_0123456789abcdef01234567"


@pytest.mark.parametrize("forgery", ["\x7f", "\x9b2K", "\u202e", "\u2028", "\u200b", "\u00a0"])
def test_a_checkpoint_whose_origin_is_not_printable_does_not_open(forgery: str) -> None:
    with pytest.raises(MalformedError, match="origin"):
        Checkpoint("log" + forgery, 0, bytes(32))
    # Signed as a note (which refuses only C0 controls) and opened by the auditor.
    text = f"log{forgery}\n0\n{'A' * 43}=\n"
    note = sign_note(text, [seeded_signer("log")])
    with pytest.raises(MalformedError, match="origin"):
        open_checkpoint(note, [seeded_signer("log").verifier()])


def test_the_gateway_refuses_such_an_origin_before_it_starts() -> None:
    problems = preflight("log\u202e", [], directory=None)
    assert [p for p in problems if p.startswith("provenance.origin: checkpoint origin must")]


def test_a_long_origin_does_not_open() -> None:
    with pytest.raises(MalformedError, match="origin"):
        Checkpoint("o" * 256, 0, bytes(32))
    assert Checkpoint("o" * 255, 0, bytes(32)).origin == "o" * 255
