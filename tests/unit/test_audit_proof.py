"""`owngate audit proof verify`: a C2SP tlog-proof file checked offline, and every way of
tampering with one refused (exit 1, the reason printed)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance import (
    ProvenanceError,
    ProvenanceLog,
    TlogProof,
    make_receipt,
    verify_receipt,
)
from gateway.provenance.audit.proof import check_tlog_proof
from gateway.provenance.formats.checkpoint import Checkpoint, sign_checkpoint
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.merkle import inclusion_proof, leaf_hash
from gateway.provenance.formats.note import Verifier, _split_note
from gateway.provenance.formats.tiles import TileReader, decode_bundle, entries_path
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.paths import VECTORS
from tests.helpers.provenance import run_audit

ORIGIN = "gateway.example/log/proofs"
SIGNER = seeded_signer(ORIGIN)
WITNESSES = [Cosigner(seeded_signer(f"witness{n}.example")) for n in (1, 2)]
# transparency-dev/tessera testdata/log (tests/vectors/README.md): a log owngate did not write
TESSERA = VECTORS / "tessera-log"
TESSERA_VKEY = "example.com/log/testdata+33d7b496+AeHTu4Q3hEIMHNqc6fASMsq3rKNx280NI+oO5xCFkkSx"


@pytest.fixture(scope="module")
def proved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A log of 5 requests; `owngate audit prove`'s proof of request 2's dispatch record
    (entry 4) as a file, and the record's bytes."""
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        for n in range(5):
            written = await log_request(log, n)
            if n == 2:
                (path.parent / "receipt.json").write_bytes(make_receipt(written.receipt, SIGNER))
        await log.close()

    asyncio.run(build())
    out = path.parent / "req-2.tlog-proof"
    text = _captured(lambda: run_audit(["prove", str(path), "req-2"]))
    out.write_text(text)
    proof = TlogProof.parse(text)
    assert proof.index == 4 and proof.extra is not None
    return out, proof.extra


def _captured(call: Callable[[], int]) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert call() == 0
    return buffer.getvalue()


def _verify(path: Path, *extra: str, key: str = SIGNER.vkey) -> int:
    return run_audit(["proof", "verify", str(path), "--key", key, *extra])


def test_a_valid_proof_verifies(
    proved: tuple[Path, bytes], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path, entry = proved
    assert _verify(path, "--origin", ORIGIN) == 0
    out = capsys.readouterr().out
    assert "ok: entry 4 (its extra line, leaf hash " in out
    assert f"checkpoint of {ORIGIN!r} of size 10, signed by {ORIGIN}+" in out
    (tmp_path / "entry").write_bytes(entry)
    assert _verify(path, "--entry", str(tmp_path / "entry")) == 0
    assert "ok: entry 4 (the entry given" in capsys.readouterr().out
    receipt = path.parent / "receipt.json"
    assert _verify(path, "--receipt", str(receipt)) == 0
    assert "ok: receipt for request req-2" in capsys.readouterr().out


def test_a_proof_without_extra_line_verifies_against_its_receipt_or_entry(
    proved: tuple[Path, bytes], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The shape `GET /v1/provenance/proofs/{id}` serves: no extra line; the receipt's
    dispatch_hash (or the entry) says what it proves, and without either it proves nothing."""
    path, entry = proved
    proof = TlogProof.parse(path.read_text())
    bare = tmp_path / "bare.tlog-proof"
    bare.write_text(TlogProof(proof.index, proof.hashes, proof.checkpoint).format())
    assert _verify(bare, "--receipt", str(path.parent / "receipt.json")) == 0
    assert "ok: entry 4 (the receipt's record" in capsys.readouterr().out
    (tmp_path / "entry").write_bytes(entry)
    assert _verify(bare, "--entry", str(tmp_path / "entry")) == 0
    assert _verify(bare) == 2
    assert "no extra line holding its entry" in capsys.readouterr().err


def _edit(text: str, line: int, change: Callable[[str], str]) -> str:
    lines = text.split("\n")
    lines[line] = change(lines[line])
    return "\n".join(lines)


def _flip_b64(value: str) -> str:
    raw = bytearray(base64.b64decode(value))
    raw[len(raw) // 2] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def _checkpoint_line(text: str, offset: int) -> int:
    """The line number of the checkpoint's line `offset` (0 origin, 1 size, 2 root)."""
    return text.split("\n").index("") + 1 + offset


def _signature_line(text: str) -> int:
    return len(text.split("\n")) - 2


TAMPERINGS: dict[str, Callable[[str], str]] = {
    "entry (extra line)": lambda t: _edit(t, 1, lambda s: "extra " + _flip_b64(s[6:])),
    "index": lambda t: _edit(t, 2, lambda _: "index 5"),
    "index with a leading zero": lambda t: _edit(t, 2, lambda _: "index 04"),
    "proof hash": lambda t: _edit(t, 3, _flip_b64),
    "checkpoint root": lambda t: _edit(t, _checkpoint_line(t, 2), _flip_b64),
    "checkpoint size": lambda t: _edit(t, _checkpoint_line(t, 1), lambda _: "11"),
    "signature": lambda t: _edit(
        t, _signature_line(t), lambda s: s.rsplit(" ", 1)[0] + " " + _flip_b64(s.rsplit(" ")[-1])
    ),
    "a line appended": lambda t: t + "trailing\n",
    "a blank line appended": lambda t: t + "\n",
    "a proof hash appended": lambda t: _edit(t, 3, lambda s: f"{s}\n{s}"),
    "a proof hash dropped": lambda t: _edit(t, 3, lambda _: "").replace("\n\n\n", "\n\n", 1),
    "a line before the index": lambda t: _edit(t, 1, lambda s: f"{s}\nnote hello"),
    "a second extra line": lambda t: _edit(t, 1, lambda s: f"{s}\n{s}"),
    "a header of another version": lambda t: _edit(t, 0, lambda _: "c2sp.org/tlog-proof@v2"),
    "CRLF line ends": lambda t: t.replace("\n", "\r\n"),
}


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_each_tampering_fails(
    proved: tuple[Path, bytes], name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path, _ = proved
    original = path.read_text()
    tampered = TAMPERINGS[name](original)
    assert tampered != original
    (tmp_path / "bad.tlog-proof").write_text(tampered)
    assert _verify(tmp_path / "bad.tlog-proof") == 1
    assert capsys.readouterr().err.startswith("FAILED: ")


def test_another_entry_or_receipt_fails(
    proved: tuple[Path, bytes], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path, entry = proved
    (tmp_path / "other").write_bytes(entry.replace(b"req-2", b"req-3"))
    assert _verify(path, "--entry", str(tmp_path / "other")) == 1
    assert "not the entry given" in capsys.readouterr().err
    proof = TlogProof.parse(path.read_text())
    bare = tmp_path / "bare.tlog-proof"
    bare.write_text(TlogProof(proof.index, proof.hashes, proof.checkpoint).format())
    assert _verify(bare, "--entry", str(tmp_path / "other")) == 1
    assert "does not lead to the root hash" in capsys.readouterr().err
    # a receipt for another entry of the same log: its dispatch hash is not this entry's
    other = TlogProof(3, proof.hashes, proof.checkpoint, extra=proof.extra)
    (tmp_path / "moved.tlog-proof").write_text(other.format())
    assert _verify(tmp_path / "moved.tlog-proof", "--receipt", str(path.parent / "receipt.json"))
    assert "FAILED" in capsys.readouterr().err


def test_a_genuine_proof_of_another_request_names_the_entry_the_receipt_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A receipt and a proof, both genuine, of two requests (the proof `GET
    /v1/provenance/proofs` served for one, checked against the other's receipt): refused
    as proofs of two entries. It was refused as a proof whose hashes do not reach the
    root, which reads as a forged proof."""

    async def build() -> None:
        log = await ProvenanceLog.open(tmp_path / "log", ORIGIN, SIGNER)
        for n in range(5):
            written = await log_request(log, n)
            if n == 2:
                (tmp_path / "receipt.json").write_bytes(make_receipt(written.receipt, SIGNER))
        await log.close()

    asyncio.run(build())
    text = _captured(lambda: run_audit(["prove", str(tmp_path / "log"), "req-3"]))
    proof = TlogProof.parse(text)
    assert proof.index == 6
    for shape in (proof, TlogProof(proof.index, proof.hashes, proof.checkpoint)):
        (tmp_path / "req-3.tlog-proof").write_text(shape.format())
        receipt = str(tmp_path / "receipt.json")  # req-2's: entry 4
        assert _verify(tmp_path / "req-3.tlog-proof", "--receipt", receipt) == 1
        err = capsys.readouterr().err
        assert "the proof is of entry 6, the receipt names entry 4: another entry" in err, err


@pytest.mark.parametrize(
    "claim",
    [
        ("request_id", "req-9"),
        ("backend", "openai-us"),
        ("backend", ""),
        ("policy_digest", "sha256:" + "cd" * 32),
    ],
)
def test_a_receipt_whose_claims_are_not_its_records_fails(
    proved: tuple[Path, bytes],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    claim: tuple[str, str],
) -> None:
    """A receipt the log signed whose dispatch_hash and index name request 2's record
    (entry 4) while it claims another request, backend (a hosted one, or a refusal) or
    policy: `receipt verify --log` refuses it, and `proof verify --receipt` said "ok" for
    it with the record in hand. Now it fails whenever the record is there (the extra
    line, or --entry); a proof without the record says the claims are not checked."""
    path, entry = proved
    genuine = verify_receipt((path.parent / "receipt.json").read_bytes(), [SIGNER.verifier()])
    forged = tmp_path / "forged.json"
    changes: dict[str, Any] = dict([claim])
    forged.write_bytes(make_receipt(dataclasses.replace(genuine, **changes), SIGNER))
    assert _verify(path, "--receipt", str(forged)) == 1
    err = capsys.readouterr().err
    assert "FAILED: entry 4 is the receipt's record, but its " in err, err
    (tmp_path / "entry").write_bytes(entry)
    proof = TlogProof.parse(path.read_text())
    bare = tmp_path / "bare.tlog-proof"
    bare.write_text(TlogProof(proof.index, proof.hashes, proof.checkpoint).format())
    assert _verify(bare, "--receipt", str(forged), "--entry", str(tmp_path / "entry")) == 1
    assert "is the receipt's record, but its " in capsys.readouterr().err
    assert _verify(bare, "--receipt", str(forged)) == 0
    out = capsys.readouterr().out
    assert "note: the proof carries no record (no extra line), so only the receipt's" in out
    assert "that record is the receipt's" not in out
    assert _verify(path, "--receipt", str(path.parent / "receipt.json")) == 0
    out = capsys.readouterr().out
    assert "ok: that record is the receipt's: request req-2, backend vllm-eu-1, policy" in out


def test_wrong_key_or_origin_fails(
    proved: tuple[Path, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = proved
    assert _verify(path, key=seeded_signer(ORIGIN, seed=2).vkey) == 1
    assert "no signature by a trusted key" in capsys.readouterr().err
    assert _verify(path, "--origin", "gateway.example/log/other") == 1
    assert "another log" in capsys.readouterr().err


def test_every_truncation_fails(proved: tuple[Path, bytes]) -> None:
    path, _ = proved
    data = path.read_bytes()
    keys = [SIGNER.verifier()]
    assert check_tlog_proof(data, keys, now=time.time()).index == 4
    for cut in range(len(data)):
        with pytest.raises(ProvenanceError):
            check_tlog_proof(data[:cut], keys, now=time.time())


def test_truncated_file_fails_on_the_command_line(
    proved: tuple[Path, bytes], tmp_path: Path
) -> None:
    path, _ = proved
    data = path.read_bytes()
    for cut in (0, 10, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.tlog-proof").write_bytes(data[:cut])
        assert _verify(tmp_path / "cut.tlog-proof") == 1


def _cosigned(path: Path, tmp_path: Path, witnesses: list[Cosigner]) -> Path:
    proof = TlogProof.parse(path.read_text())
    text, _ = _split_note(proof.checkpoint)
    note = proof.checkpoint
    for witness in witnesses:
        note += witness.cosign(text, int(time.time()) - 60).line().encode()
    out = tmp_path / "cosigned.tlog-proof"
    out.write_text(TlogProof(proof.index, proof.hashes, note, extra=proof.extra).format())
    return out


def test_witness_quorum(
    proved: tuple[Path, bytes], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path, _ = proved
    keys = [item for w in WITNESSES for item in ("--witness-key", w.vkey)]
    cosigned = _cosigned(path, tmp_path, WITNESSES[:1])
    assert _verify(cosigned, *keys) == 0
    assert "cosigned by 1 of the 2 witness key(s)" in capsys.readouterr().out
    assert _verify(cosigned, *keys, "--min-witnesses", "2") == 1
    assert "fewer than 2" in capsys.readouterr().err
    assert _verify(path, *keys) == 1  # not cosigned at all
    # a witness's line altered: refused, not skipped
    text = cosigned.read_text()
    cosigned.write_text(_edit(text, _signature_line(text), lambda s: s[:-3] + "AA="))
    assert _verify(cosigned, *keys) == 1
    # the log's own key as a witness witnesses nothing
    own = Cosigner(SIGNER).vkey
    assert _verify(path, "--witness-key", own) == 2


def test_a_proof_from_an_independent_log_verifies(tmp_path: Path) -> None:
    """A tlog-proof over the Tessera log's checkpoint and tiles (another implementation's
    output), checked with its verifier key; the same proof with a flipped hash fails."""
    note = (TESSERA / "checkpoint").read_bytes()
    size = 15
    entries = decode_bundle((TESSERA / entries_path(0, size)).read_bytes())
    for index in (0, 7, 14):
        hashes = inclusion_proof(index, size, TileReader(TESSERA, size).node)
        proof = TlogProof(index, tuple(hashes), note, extra=entries[index])
        (tmp_path / "t.tlog-proof").write_text(proof.format())
        argv = ["--origin", "example.com/log/testdata"]
        assert _verify(tmp_path / "t.tlog-proof", *argv, key=TESSERA_VKEY) == 0
        wrong = TlogProof(index, (hashes[0][::-1], *hashes[1:]), note, extra=entries[index])
        (tmp_path / "t.tlog-proof").write_text(wrong.format())
        assert _verify(tmp_path / "t.tlog-proof", key=TESSERA_VKEY) == 1
    assert Verifier(TESSERA_VKEY).name == "example.com/log/testdata"


@pytest.mark.parametrize(
    "entry",
    [
        b'{"request_id":"r","type":"admin","request_id":"s"}',  # a member written twice
        b'{"v": 1}',  # whitespace: not its own RFC 8785 encoding
        b'{"type":"completion"}',  # JSON, not a schema-v1 record
    ],
)
def test_a_json_entry_that_is_no_valid_record_fails(
    entry: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A proof whose entry is JSON is read as a record, so it is held to what `audit
    verify` holds every entry to. Before, `proof verify` said ok to a one-entry tree the
    log's key signed over a record with a duplicated member (which parsers read
    differently) while `audit verify` on that log refused it; found by an independent
    verifier written from the docs. An entry that is not JSON (another log's) is only
    proved included (`test_a_proof_from_an_independent_log_verifies`)."""
    root = leaf_hash(entry)
    note = sign_checkpoint(Checkpoint(ORIGIN, 1, root), [SIGNER])
    path = tmp_path / "one.tlog-proof"
    path.write_text(TlogProof(0, (), note, extra=entry).format())
    assert _verify(path) == 1
    assert "entry 0: not a valid schema-v1 record" in capsys.readouterr().err
    (tmp_path / "entry").write_bytes(entry)
    assert _verify(path, "--entry", str(tmp_path / "entry")) == 1
