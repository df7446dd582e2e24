"""An auditor's tools against a log around a key rotation, attacked by whoever kept the
retired key (and the log directory), or holds another log's key the auditor also trusts.

Before: `audit receipt verify --log` and `audit open --receipt --log` accepted a receipt
the retired key A signed for an entry appended after the rotation, under a checkpoint A
signed alone (only `audit verify` held the history to the rotation order); a log whose
origin names no key (`serve --workers`: `ORIGIN/worker-1`, signed by the key named
ORIGIN) took a checkpoint signed by another log's key as its "next rotation"; and with
`--accept-earlier-keys`, A's lines removed from the history made A read as a new key.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.provenance import (
    LogDirectory,
    LogVerificationError,
    ProvenanceLog,
    Signer,
    make_receipt,
    verify_log,
    verify_receipt,
)
from gateway.provenance.audit.receipt_keys import check_receipt_key
from gateway.provenance.formats.note import sign_note
from gateway.provenance.testing import LoggedRequest, log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "test.owngate/rotation-attacks"
OLD, NEW = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
REQUEST = b'{"model":"m","messages":[]}'  # what log_request commits to


def _phase(
    directory: Path,
    signer: Signer,
    cosigners: Sequence[Signer],
    number: int,
    origin: str = ORIGIN,
    retired: Sequence[Signer] = (OLD, NEW),
) -> LoggedRequest:
    """One request logged under `signer` (and `cosigners`); the log may go on from a
    checkpoint any of `retired` signed (whoever holds one of them)."""

    async def run() -> LoggedRequest:
        keys = [key.verifier() for key in retired]
        log = await ProvenanceLog.open(directory, origin, signer, cosigners=cosigners, retired=keys)
        logged = await log_request(log, number)
        await log.close()
        return logged

    return asyncio.run(run())


def _rotated(directory: Path) -> None:
    """The documented rotation: A, A+B, B."""
    _phase(directory, OLD, [], 0)
    _phase(directory, NEW, [OLD], 1)
    _phase(directory, NEW, [], 2)


def _receipt_checks(log: Path, envelope: bytes, tmp_path: Path) -> list[int]:
    """The exit codes of `receipt verify --log` and `open --receipt --log`, both keys."""
    path = tmp_path / "receipt.json"
    path.write_bytes(envelope)
    (tmp_path / "request.json").write_bytes(REQUEST)
    keys = ["--key", OLD.vkey, "--key", NEW.vkey, "--log", str(log)]
    return [
        run_audit(["receipt", "verify", str(path), *keys]),
        run_audit(["open", str(tmp_path / "request.json"), "--receipt", str(path), *keys]),
    ]


def test_a_receipt_the_retired_key_signs_under_its_own_late_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    _rotated(log)
    late = _phase(log, OLD, [], 3)  # A appends and signs alone after the rotation
    forged = make_receipt(late.receipt, OLD)
    keys = [OLD.verifier(), NEW.verifier()]
    with pytest.raises(LogVerificationError, match="retired by a rotation signed again"):
        check_receipt_key(LogDirectory(log), forged, verify_receipt(forged, keys), keys)
    capsys.readouterr()
    assert _receipt_checks(log, forged, tmp_path) == [1, 1]
    captured = capsys.readouterr()
    assert captured.err.count("a key retired by a rotation signed again") == 2
    assert "opens the request commitment" not in captured.out
    with pytest.raises(LogVerificationError, match="retired by a rotation signed again"):
        verify_log(log, keys)  # as `audit verify` refused it already


def test_a_late_checkpoint_kept_out_of_the_history_keeps_the_rotation_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no history file covering the receipt's entry, the receipt checks take the
    log's served checkpoint as the first to cover it. Before, they held only a history
    file to the rotation order: whoever kept A signed the served checkpoint alone, left
    its history file out (and any above the entry), and the receipt A signed passed."""
    log = tmp_path / "log"
    _rotated(log)
    late = _phase(log, OLD, [], 3)  # A appends and signs alone after the rotation
    for path in (log / "checkpoints").iterdir():
        if int(path.name) > late.receipt.index:
            path.unlink()  # the served checkpoint alone covers the late entry
    forged = make_receipt(late.receipt, OLD)
    keys = [OLD.verifier(), NEW.verifier()]
    with pytest.raises(LogVerificationError, match="retired by a rotation signed again"):
        check_receipt_key(LogDirectory(log), forged, verify_receipt(forged, keys), keys)
    capsys.readouterr()
    assert _receipt_checks(log, forged, tmp_path) == [1, 1]
    assert capsys.readouterr().err.count("a key retired by a rotation signed again") == 2


def test_receipts_of_an_honest_rotation_still_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    logged = [_phase(log, OLD, [], 0), _phase(log, NEW, [OLD], 1), _phase(log, NEW, [], 2)]
    for entry, signer in zip(logged, (OLD, NEW, NEW), strict=True):
        assert _receipt_checks(log, make_receipt(entry.receipt, signer), tmp_path) == [0, 0]
    capsys.readouterr()
    # the auditor holding only the new key: the old checkpoints are skipped, as before
    newest = make_receipt(logged[2].receipt, NEW)
    (tmp_path / "new.json").write_bytes(newest)
    only_new = ["--key", NEW.vkey, "--log", str(log)]
    assert run_audit(["receipt", "verify", str(tmp_path / "new.json"), *only_new]) == 0


def test_another_logs_key_does_not_rotate_into_a_log_whose_origin_names_no_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serve --workers` signs `ORIGIN/worker-1` with the key named ORIGIN, so the
    origin rule (a key named for the origin must sign) never applies: a replica's key,
    trusted beside it, signed on as a "new rotation"."""
    log, origin = tmp_path / "log", f"{ORIGIN}/worker-1"
    replica = seeded_signer("replica.example/log", 6)
    _phase(log, NEW, [], 0, origin)
    _phase(log, replica, [], 1, origin, retired=(NEW,))
    late = _phase(log, replica, [], 2, origin, retired=(replica,))
    keys = [NEW.verifier(), replica.verifier()]
    with pytest.raises(LogVerificationError, match="a key rotation keeps the key's name"):
        verify_log(log, keys)
    forged = make_receipt(late.receipt, replica)
    with pytest.raises(LogVerificationError, match="a key rotation keeps the key's name"):
        check_receipt_key(LogDirectory(log), forged, verify_receipt(forged, keys), keys)
    argv = ["verify", str(log), "--key", NEW.vkey, "--key", replica.vkey]
    assert run_audit(argv) == 1
    assert "another log's key" in capsys.readouterr().err


def _strip(log: Path, key: Signer) -> None:
    """Take `key`'s signature lines off every history checkpoint (and the served one); a
    note left with none gets a line by an unknown key (a note needs one)."""
    junk = seeded_signer("junk.example/x", 7)
    prefix = f"\u2014 {key.name} ".encode()
    for path in [*sorted((log / "checkpoints").iterdir()), log / "checkpoint"]:
        text, _, block = path.read_bytes().partition(b"\n\n")
        lines = [line for line in block.split(b"\n") if line]
        kept = [
            line
            for line in lines
            if not line.startswith(prefix)
            or base64.b64decode(line[len(prefix) :])[:4] != key.key_id.to_bytes(4, "big")
        ]
        note = text + b"\n\n" + b"".join(line + b"\n" for line in kept)
        path.write_bytes(note if kept else sign_note((text + b"\n").decode(), [junk]))


def test_the_retired_keys_lines_taken_off_the_history_do_not_make_it_a_new_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    _rotated(log)
    _strip(log, OLD)  # A, A+B, B now read X, B, B: A never signed, as far as the files say
    late = _phase(log, OLD, [], 3)
    keys = [OLD.verifier(), NEW.verifier()]
    with pytest.raises(LogVerificationError, match="without the newest key"):
        verify_log(log, keys, accept_earlier_keys=True)
    with pytest.raises(LogVerificationError, match="no signature by a trusted key"):
        verify_log(log, keys)  # strict: the stripped checkpoints carry no trusted key
    forged = make_receipt(late.receipt, OLD)
    capsys.readouterr()
    assert _receipt_checks(log, forged, tmp_path) == [1, 1]
    assert capsys.readouterr().err.count("without the newest key") == 2


@pytest.mark.parametrize(
    "name",
    [
        ORIGIN.upper(),  # differs by case
        ORIGIN.replace("o", "\u043e", 1),  # a Cyrillic o
        ORIGIN + "\u200b",  # a zero-width space after it
    ],
    ids=["case", "cyrillic", "zero-width"],
)
def test_a_key_whose_name_looks_like_the_origin_signs_nothing_for_it(
    tmp_path: Path, name: str
) -> None:
    log, alike = tmp_path / "log", seeded_signer(name, 9)
    _phase(log, OLD, [], 0)
    _phase(log, alike, [OLD], 1)  # an "overlap" with it
    late = _phase(log, alike, [], 2, retired=(alike,))
    keys = [OLD.verifier(), alike.verifier()]
    with pytest.raises(LogVerificationError, match="another log's key"):
        verify_log(log, keys)
    forged = make_receipt(late.receipt, alike)
    (tmp_path / "r.json").write_bytes(forged)
    argv = ["receipt", "verify", str(tmp_path / "r.json"), "--key", OLD.vkey, "--key", alike.vkey]
    assert run_audit(argv) == 1
