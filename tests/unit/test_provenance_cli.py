"""`owngate audit prove / receipt verify / open / show`, and the signing-key file."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from gateway.canonical import canonical_json
from gateway.provenance import (
    KeyFormatError,
    ProvenanceLog,
    Receipt,
    TlogProof,
    Verifier,
    load_signer,
    make_receipt,
    seal_receipts,
    verify_tlog_proof,
    write_signing_key,
)
from gateway.provenance.formats.commitments import commit
from gateway.provenance.formats.tiles import decode_bundle, encode_bundle
from gateway.provenance.testing import (
    EXAMPLE_HOSTED,
    CountingRandom,
    log_refusal,
    log_request,
    seeded_signer,
)
from tests.helpers.provenance import run_audit

ORIGIN = "gateway.example/log/replica-1"
SIGNER = seeded_signer(ORIGIN)
REQUEST_BODY = b'{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}]}'
RESPONSE_BODY = b'{"choices":[{"message":{"content":"hello"}}]}'


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A log of 6 requests (one hosted fallback, one other tenant) and 1 refusal; a receipt."""
    path = tmp_path_factory.mktemp("log")
    receipt_file = path.parent / "receipt.json"

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        first = await log_request(log, 0, request_body=REQUEST_BODY, response_body=RESPONSE_BODY)
        receipt_file.write_bytes(make_receipt(first.receipt, SIGNER))
        # the same receipt as a batch receipt (v2), in a batch with a neighbour's
        neighbour = dataclasses.replace(first.receipt, request_id="req-x", index=99)
        payloads = [(r.index, canonical_json(r.payload())) for r in (first.receipt, neighbour)]
        batched = seal_receipts(payloads, ORIGIN, SIGNER)[0]
        (path.parent / "receipt-v2.json").write_bytes(batched)
        for n in range(1, 4):
            await log_request(log, n)
        await log_request(log, 4, backend=EXAMPLE_HOSTED, fallback_reason="private_saturated")
        await log_request(log, 5, tenant="beta")
        await log_refusal(log, 6)
        await log.close()

    asyncio.run(build())
    return path, receipt_file


def test_prove_prints_a_tlog_proof_that_verifies(
    logdir: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = logdir
    assert run_audit(["prove", str(path), "req-3", "--record", "completion"]) == 0
    proof = TlogProof.parse(capsys.readouterr().out)
    assert proof.index == 7 and proof.extra is not None
    signed = verify_tlog_proof(proof, proof.extra, [SIGNER.verifier()], origin=ORIGIN)
    assert signed.checkpoint.size == 13
    assert run_audit(["prove", str(path), "req-404"]) == 1
    assert "no dispatch record of 'req-404'" in capsys.readouterr().err


def test_receipt_verify_alone_and_against_the_log(
    logdir: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, single = logdir
    for receipt, form in ((single, ""), (single.parent / "receipt-v2.json", " (v2: ")):
        assert run_audit(["receipt", "verify", str(receipt), "--key", SIGNER.vkey]) == 0
        signed = f"of the log {ORIGIN} signed by the key {SIGNER.verifier()}{form}"
        assert f"ok: receipt for request req-0 {signed}" in capsys.readouterr().out
        argv = ["receipt", "verify", str(receipt), "--key", SIGNER.vkey, "--log", str(path)]
        assert run_audit(argv) == 0
        assert "ok: entry 0 is in the checkpoint of size 13" in capsys.readouterr().out
        other = seeded_signer(ORIGIN, seed=9).vkey
        assert run_audit(["receipt", "verify", str(receipt), "--key", other]) == 1
        assert "not signed by a trusted key" in capsys.readouterr().err


def test_receipt_verify_with_the_log_refuses_claims_its_record_contradicts(
    logdir: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A receipt the log's key signed, naming entry 0 by its hash, whose other claims are
    not entry 0's (another request, backend or policy, or a refusal for a dispatch): the
    log does not hold what it says, whatever the signature (a sealing bug, or a key that
    signed what the log never wrote)."""
    path, single = logdir
    receipt = Receipt.from_payload(
        json.loads(base64.b64decode(json.loads(single.read_bytes())["payload"]))
    )
    lies = {
        "request_id": (dataclasses.replace(receipt, request_id="req-5"), "request"),
        "backend": (dataclasses.replace(receipt, backend=EXAMPLE_HOSTED.id), "backend"),
        "refusal": (dataclasses.replace(receipt, backend=""), "dispatch"),
        "policy": (dataclasses.replace(receipt, policy_digest="sha256:" + "cd" * 32), "policy"),
    }
    for name, (lie, problem) in lies.items():
        forged = tmp_path / f"{name}.json"
        forged.write_bytes(make_receipt(lie, SIGNER))
        argv = ["receipt", "verify", str(forged), "--key", SIGNER.vkey, "--log", str(path)]
        assert run_audit(argv) == 1, name
        assert problem in capsys.readouterr().err, name


def test_open_with_salt_or_with_receipt_and_log(
    logdir: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, receipt = logdir
    body = tmp_path / "request.json"
    body.write_bytes(REQUEST_BODY)
    argv = ["open", str(body), "--receipt", str(receipt), "--log", str(path)]
    assert run_audit([*argv, "--key", SIGNER.vkey]) == 0
    assert "opens the request commitment" in capsys.readouterr().out
    response = tmp_path / "response.json"
    response.write_bytes(RESPONSE_BODY)
    argv = ["open", str(response), "--kind", "response", "--receipt", str(receipt)]
    assert run_audit([*argv, "--log", str(path), "--key", SIGNER.vkey]) == 0
    body.write_bytes(REQUEST_BODY + b" ")
    argv = ["open", str(body), "--receipt", str(receipt), "--log", str(path)]
    assert run_audit([*argv, "--key", SIGNER.vkey]) == 1
    assert "do not open this request commitment" in capsys.readouterr().err
    salt = CountingRandom("request/0")(32).hex()
    argv = ["open", str(body), "--salt", salt, "--commitment", "00" * 32]
    assert run_audit(argv) == 1
    assert run_audit(["open", str(body)]) == 2


def test_open_with_a_receipt_reads_the_commitments_its_records_prove(
    logdir: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`open --receipt` takes the commitments from the record the receipt names (and its
    completion), proved in the signed checkpoint: a copy of the log whose entries were
    edited to commit to other bodies (with the salts the receipt carries) opens nothing."""
    path, receipt_file = logdir
    receipt = Receipt.from_payload(
        json.loads(base64.b64decode(json.loads(receipt_file.read_bytes())["payload"]))
    )
    edited = tmp_path / "log"
    shutil.copytree(path, edited)
    lies = {
        "request_commitment": ("request", commit("request", receipt.salts.request, b"other")),
        "response_commitment": ("response", commit("response", receipt.salts.response, b"other")),
    }
    for bundle in (edited / "tile" / "entries").rglob("*"):  # every (partial) bundle 000
        if bundle.is_file():
            entries = decode_bundle(bundle.read_bytes())
            for n, entry in enumerate(entries[:2]):  # req-0's dispatch and completion
                record = json.loads(entry)
                for field, (_, lie) in lies.items():
                    if field in record:
                        record[field] = lie
                entries[n] = canonical_json(record)
            bundle.chmod(0o644)
            bundle.write_bytes(encode_bundle(entries))
    other = tmp_path / "other.json"
    other.write_bytes(b"other")
    for kind, _ in lies.values():
        argv = ["open", str(other), "--kind", kind, "--receipt", str(receipt_file)]
        assert run_audit([*argv, "--log", str(edited), "--key", SIGNER.vkey]) == 1, kind
        assert "FAILED: " in capsys.readouterr().err


def test_show_summarises_backends_fallbacks_and_refusals(
    logdir: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = logdir
    assert run_audit(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "6 dispatched, 6 completed, 1 refused (of 13 entries)" in out
    assert "fallback: 1 x private_saturated" in out
    assert "refusal: 1 x hosted.deny" in out
    assert "region: 5 x eu-west\nregion: 1 x us\n" in out  # per region, over its backends
    assert "data class: 6 x (not recorded)\n" in out  # records from before the field
    assert run_audit(["show", str(path), "--tenant", "beta", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dispatched"] == 1 and report["refused"] == 0
    assert report["regions"] == {"eu-west": 1}
    assert report["data_classes"] == {"(not recorded)": 1}
    argv = ["show", str(path), "--backend", "openai-us", "--json", "--records"]
    assert run_audit(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["type"] for r in report["records"]] == ["dispatch", "completion"]
    assert report["backends"][0]["region"] == "us"
    argv = ["show", str(path), "--since", "2026-01-01T00:00:03Z", "--until", "2026-01-01T00:00:05Z"]
    assert run_audit([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dispatched"] == 2
    assert run_audit(["show", str(path), "--since", "2026-01-01"]) == 2


def test_verify_reads_keys_from_the_environment(
    logdir: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = logdir
    monkeypatch.setenv("OWNGATE_AUDIT_KEY", f"{seeded_signer(ORIGIN, 5).vkey},{SIGNER.vkey}")
    assert run_audit(["verify", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["size"] == 13


def test_missing_log_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_audit(["verify", str(tmp_path / "nope"), "--key", SIGNER.vkey]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_write_signing_key(tmp_path: Path) -> None:
    path = tmp_path / "log.key"
    vkey = write_signing_key(path, "gateway.example/log/replica-1")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text().startswith("PRIVATE+KEY+gateway.example/log/replica-1+")
    assert load_signer(path).vkey == vkey
    assert Verifier(vkey).name == "gateway.example/log/replica-1"
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        write_signing_key(path, "other")
    with pytest.raises(KeyFormatError, match="whitespace"):
        write_signing_key(tmp_path / "bad.key", "has space")
    os.chmod(path, 0o644)
    with pytest.raises(KeyFormatError, match="chmod 600"):
        load_signer(path)
