"""`cosigned/` files and the log's own signature lines (audit.cosigned `_log_lines_known`).

A cosigned file whose checkpoint text is the history note's is taken without opening it
again when its log lines are the history note's own, byte for byte. That shortcut must not
skip a line by another trusted key (a forged one beside the genuine line failed when the
note was opened in full), nor refuse the cosigned checkpoints from before a key rotation
that `--accept-earlier-keys` takes (their history notes carry only earlier keys' lines).
"""

from __future__ import annotations

import asyncio
import base64
import re
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.provenance import LogVerificationError, ProvenanceLog, Signer, verify_log
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.layout import cosigned_path, list_history
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "test.owngate/cosigned-log-lines"
WITNESS = Cosigner(seeded_signer("witness.example/w1"))
NOW = 1_800_000_000.0


def _phase(directory: Path, signer: Signer, cosigners: Sequence[Signer], request: int) -> None:
    retired = [seeded_signer(ORIGIN, n).verifier() for n in (1, 2)]

    async def run() -> None:
        log = await ProvenanceLog.open(
            directory, ORIGIN, signer, cosigners=cosigners, retired=retired
        )
        await log_request(log, request)
        await log.close()

    asyncio.run(run())


def _cosign_history(directory: Path, extra: bytes = b"") -> None:
    """Write `cosigned/<size>` for each history checkpoint as the gateway does (the history
    note whole, then the witness's line), with `extra` signature lines before the latter."""
    for size, path in list_history(directory):
        note = path.read_bytes()
        text = note.partition(b"\n\n")[0] + b"\n"
        line = WITNESS.cosign(text.decode(), 1_700_000_000).line().encode()
        cosigned_path(directory, size).parent.mkdir(exist_ok=True)
        cosigned_path(directory, size).write_bytes(note + extra + line)


def _forged_line(signer: Signer) -> bytes:
    """A signature line under `signer`'s name and key id whose signature is zeros."""
    blob = struct.pack(">I", signer.key_id) + bytes(64)
    return f"\u2014 {signer.name} {base64.b64encode(blob).decode()}\n".encode()


def test_a_forged_line_by_another_trusted_key_beside_the_genuine_one_fails(
    tmp_path: Path,
) -> None:
    # Before: every line by a key the history note was not signed with was skipped, so
    # with two trusted keys (a rotation's overlap) a zero "signature" by the second passed.
    signer, other = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
    _phase(tmp_path, signer, [], 0)
    keys = [signer.verifier(), other.verifier()]
    _cosign_history(tmp_path)
    assert verify_log(tmp_path, keys, witnesses=[WITNESS.vkey], now=NOW).witnesses is not None
    _cosign_history(tmp_path, extra=_forged_line(other))
    with pytest.raises(LogVerificationError, match=re.escape(f"invalid signature for key {other}")):
        verify_log(tmp_path, keys, witnesses=[WITNESS.vkey], now=NOW)


def test_cosigned_checkpoints_from_before_a_rotation_verify_with_the_new_key_alone(
    tmp_path: Path,
) -> None:
    # Before: the history note of a checkpoint only the old key signed has no verified
    # line, so its cosigned file was opened in full and refused ("no signature by a
    # trusted key"), while `--accept-earlier-keys` takes that very checkpoint.
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
    _phase(tmp_path, old, [], 0)
    _phase(tmp_path, new, [old], 1)
    _phase(tmp_path, new, [], 2)
    _cosign_history(tmp_path)
    summary = verify_log(
        tmp_path, [new.verifier()], accept_earlier_keys=True, witnesses=[WITNESS.vkey], now=NOW
    )
    assert summary.earlier_checkpoints > 0 and summary.witnesses is not None
    assert summary.witnesses.cosigned == len(list_history(tmp_path))


@pytest.mark.parametrize("which", ["trusted", "earlier"])
def test_an_earlier_checkpoints_cosigned_file_needs_its_own_lines(
    tmp_path: Path, which: str
) -> None:
    old, new = seeded_signer(ORIGIN, 1), seeded_signer(ORIGIN, 2)
    _phase(tmp_path, old, [], 0)
    _phase(tmp_path, new, [old], 1)
    _phase(tmp_path, new, [], 2)
    first = list_history(tmp_path)[0][0]
    _cosign_history(tmp_path)
    path = cosigned_path(tmp_path, first)
    text, _, rest = path.read_bytes().partition(b"\n\n")
    witness_line = rest.splitlines(keepends=True)[-1]
    # an earlier checkpoint's text with a forged line by the trusted key, or with the
    # earlier key's line altered: neither is the note the history holds
    forged = _forged_line(new if which == "trusted" else old)
    path.write_bytes(text + b"\n\n" + forged + witness_line)
    with pytest.raises(LogVerificationError, match=f"cosigned/{path.name}"):
        verify_log(
            tmp_path,
            [new.verifier()],
            accept_earlier_keys=True,
            witnesses=[WITNESS.vkey],
            now=NOW,
        )


# --- `audit prove --cosigned` -------------------------------------------------------------


def _prove(directory: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = run_audit(["prove", str(directory), "req-0", "--cosigned"])
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def _rewrite_newest_cosigned(directory: Path, log_lines: bytes, size: int | None = None) -> str:
    """`cosigned/<size>` (the newest history size by default) as the newest history note's
    text, `log_lines` and the witness's line; returns the witness line."""
    newest = list_history(directory)[-1][1].read_bytes()
    text = newest.partition(b"\n\n")[0] + b"\n"
    line = WITNESS.cosign(text.decode(), 1_700_000_000).line()
    path = cosigned_path(directory, size if size is not None else list_history(directory)[-1][0])
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(text + b"\n" + log_lines + line.encode())
    return line


def test_prove_cosigned_quotes_the_logs_note_with_the_witness_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    signer = seeded_signer(ORIGIN, 1)
    _phase(tmp_path, signer, [], 0)
    _cosign_history(tmp_path)
    code, out, err = _prove(tmp_path, capsys)
    assert code == 0, err
    newest = list_history(tmp_path)[-1][1].read_bytes()
    assert newest.decode() in out and WITNESS.name in out


@pytest.mark.parametrize("which", ["none", "forged", "beside", "no-history-size"])
def test_prove_cosigned_refuses_a_note_without_the_logs_own_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    # Before: the cosigned file went into the proof unchecked: with no log line, a forged
    # one, a forged one beside the genuine one, or at a size the log never signed.
    signer = seeded_signer(ORIGIN, 1)
    _phase(tmp_path, signer, [], 0)
    size, newest = list_history(tmp_path)[-1]
    genuine = newest.read_bytes().partition(b"\n\n")[2]
    lines = {
        "none": b"",
        "forged": _forged_line(signer),
        "beside": genuine + _forged_line(signer),
        "no-history-size": genuine,
    }[which]
    _rewrite_newest_cosigned(tmp_path, lines, size - 1 if which == "no-history-size" else None)
    code, out, err = _prove(tmp_path, capsys)
    assert code == 1, out + err
    assert "FAILED: cosigned/" in err and "no proof against it" in err, err
    assert out == ""
