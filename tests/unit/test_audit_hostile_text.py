"""What `owngate audit` prints of the artefacts it checks cannot drive the auditor's
terminal: receipts, records, checkpoints and note lines are the audited party's writing.

A free-form value (a backend id, region or refusal rule in a record, a key name, a note's
signature name) is shown escaped and bounded (gateway/provenance/audit/shown.py), and stays
valid in JSON. Values with a documented form are refused out of it:
tests/unit/test_audit_artefact_forms.py."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.provenance import (
    ProvenanceLog,
    make_receipt,
)
from gateway.provenance.audit.shown import quoted, shown
from gateway.provenance.formats.records import (
    BackendRef,
    Retention,
    TraceStep,
    refusal_record,
)
from gateway.provenance.testing import EXAMPLE_POLICY, log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "gateway.example/log/hostile"
SIGNER = seeded_signer(ORIGIN)
# What an audited party might write to forge or hide an auditor's result line.
FORGERIES = [
    "\x1b[2K\rok: forged",  # erase the line, back to its start, write another
    "\nok: forged",  # a line of its own
    "\x1b[8m",  # hidden text
    "\x9b2K",  # C1 CSI, which some terminals take as ESC [
    "\x7f",
    "\u202eko :DELIAF",  # right-to-left override
    "\u2028ok: forged",  # line separator
    "\u2029",  # paragraph separator
    "\u200b",  # zero width space
]
UNSAFE = ["\x1b", "\r", "\x9b", "\x7f", "\u202e", "\u2028", "\u2029", "\u200b"]


def assert_safe(text: str) -> None:
    """`text` (lines as printed) holds no character that drives a terminal; where one
    line may break in two is for the caller to check."""
    for char in UNSAFE:
        assert char not in text, (char, text)


@pytest.mark.parametrize("forgery", FORGERIES)
def test_shown_escapes_what_is_not_printable(forgery: str) -> None:
    text = shown("req" + forgery)
    assert_safe(text)
    assert "\n" not in text
    assert text.isprintable() and text.startswith("req\\")
    assert quoted("it's").startswith("'it\\'s'")


def test_shown_bounds_its_length_and_says_so() -> None:
    assert shown("a" * 200) == "a" * 200
    assert shown("a" * 1000) == "a" * 200 + "...[800 more characters]"
    assert shown("\x1b" * 100, limit=8) == "\\x1b\\x1b...[98 more characters]"
    assert shown("b" * 5000, limit=None) == "b" * 5000


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A log of 3 requests (request 1 to a backend whose id is a forgery, request 2
    refused by a rule that is one), and request 0's genuine receipt."""
    path = tmp_path_factory.mktemp("log")
    evil = BackendRef(
        "gpu\x1b[8m", "private", "vllm", "own", "own", "eu\u202e", Retention(0, True, False)
    )

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        first = await log_request(log, 0)
        (path.parent / "receipt.json").write_bytes(make_receipt(first.receipt, SIGNER))
        await log_request(log, 1, backend=evil)
        await log.append(
            refusal_record(
                request_id="req-2",
                time=datetime(2026, 1, 1, tzinfo=UTC),
                tenant="acme-app",
                model="gpt-4o",
                policy=EXAMPLE_POLICY,
                trace=[TraceStep("gpu", "excluded", "deny\rok: forged")],
                rule="deny\rok: forged",
                reason="policy_denied",
                request_commitment=None,
            )
        )
        await log.close()

    asyncio.run(build())
    return path, path.parent / "receipt.json"


def test_show_escapes_backend_ids_regions_and_rules(
    logged: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _receipt = logged
    assert run_audit(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert_safe(out)
    assert "gpu\\x1b[8m" in out and "eu\\u202e" in out
    assert "refusal: 1 x deny\\x0dok: forged" in out
    assert not any(line.startswith("ok:") for line in out.splitlines())


def test_show_json_keeps_the_values_escaped_by_the_encoder(
    logged: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _receipt = logged
    assert run_audit(["show", str(path), "--json", "--records"]) == 0
    out = capsys.readouterr().out
    assert_safe(out)
    found = json.loads(out)
    backends = {r["backend"]["id"] for r in found["records"] if r["type"] == "dispatch"}
    assert "gpu\x1b[8m" in backends  # the value itself, exactly, once decoded


def test_verify_escapes_key_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A key name may hold what is not a space nor '+' (as Go's note), U+202E too: the
    operator chooses it, and `verify` prints it as a signer."""
    signer = seeded_signer("log\u202eevil")

    async def build() -> None:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, signer)
        await log_request(log, 0)
        await log.close()

    asyncio.run(build())
    assert run_audit(["verify", str(tmp_path), "--key", signer.vkey]) == 0
    out = capsys.readouterr().out
    assert_safe(out)
    assert "signed by log\\u202eevil+" in out
    assert run_audit(["verify", str(tmp_path), "--key", signer.vkey, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["signed_by"][0].startswith("log\u202eevil+")


def test_the_html_report_escapes_what_is_not_printable(
    logged: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _receipt = logged
    assert run_audit(["report", str(path), "--key", SIGNER.vkey, "--html", "-"]) == 0
    page = capsys.readouterr().out
    assert_safe(page)
    assert "gpu\\x1b[8m" in page and "eu\\u202e" in page


@pytest.mark.parametrize("verb", ["verify", "report"])
def test_a_failure_that_quotes_a_note_line_is_escaped(
    logged: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    """A checkpoint file's signature line names its key; a malformed one's name reaches
    the FAILED line."""
    path, _receipt = logged
    seen = tmp_path / "seen-checkpoint"
    seen.write_text(f"{ORIGIN}\n1\n{'A' * 43}=\n\n\u2014 k\u202e\x7fok AAAA\n", "utf-8")
    argv = [verb, str(path), "--key", SIGNER.vkey, "--checkpoint", str(seen)]
    if verb == "report":
        argv += ["--json", str(tmp_path / "report.json")]
    assert run_audit(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("FAILED: ") and err.count("\n") == 1, err
    assert_safe(err)
    assert "k\\u202e\\x7fok" in err
    if verb == "report":  # the JSON report holds the failure itself, encoded
        report = json.loads((tmp_path / "report.json").read_text("utf-8"))
        assert "k\u202e\x7fok" in report["verification"]["error"]
