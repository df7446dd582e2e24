"""`owngate audit prove --cosigned` with `--receipt FILE` or `--index N`: the record chosen
is the one proved, against the newest witness-cosigned checkpoint covering it, and `proof
verify --receipt --witness-key` accepts the proof of the receipt's attempt (and refuses
that of another attempt).

A request that failed over has a dispatch record per attempt; the attempts here are in
different checkpoints, each cosigned, so the checkpoint a proof is against depends on the
record chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path

from gateway.provenance import ProvenanceLog, TlogProof, make_receipt
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.layout import cosigned_path, list_history
from gateway.provenance.testing import CountingRandom, LoggedRequest, log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "test.owngate/prove-cosigned-choice"
SIGNER = seeded_signer(ORIGIN, 1)
WITNESS = Cosigner(seeded_signer("witness.example/w1"))


def _two_attempts(directory: Path) -> tuple[LoggedRequest, LoggedRequest]:
    """req-1 logged twice (two attempts, other salts), each phase closed with a checkpoint;
    every history checkpoint cosigned as the gateway writes `cosigned/`."""

    async def phase(number: int, random: str) -> LoggedRequest:
        log = await ProvenanceLog.open(directory, ORIGIN, SIGNER)
        logged = await log_request(log, number, random=CountingRandom(random))
        await log.close()
        return logged

    attempts = (
        asyncio.run(phase(0, "other")),
        asyncio.run(phase(1, "first")),
        asyncio.run(phase(1, "second")),
    )
    for size, path in list_history(directory):
        note = path.read_bytes()
        text = note.partition(b"\n\n")[0] + b"\n"
        line = WITNESS.cosign(text.decode(), 1_700_000_000).line().encode()
        cosigned_path(directory, size).parent.mkdir(exist_ok=True)
        cosigned_path(directory, size).write_bytes(note + line)
    return attempts[1], attempts[2]


def _prove(directory: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_audit(["prove", str(directory), "req-1", "--cosigned", *argv])
    return code, out.getvalue(), err.getvalue()


def _verify(tmp_path: Path, proof: str, receipt: Path) -> int:
    (tmp_path / "proof").write_text(proof)
    return run_audit(
        [
            "proof", "verify", str(tmp_path / "proof"), "--key", SIGNER.vkey,
            "--receipt", str(receipt), "--witness-key", WITNESS.vkey,
        ]
    )  # fmt: skip


def test_prove_cosigned_proves_the_attempt_a_receipt_or_index_names(tmp_path: Path) -> None:
    first, second = _two_attempts(tmp_path / "log")
    receipts = {}
    for name, attempt in (("first", first), ("second", second)):
        receipts[name] = tmp_path / f"{name}.json"
        receipts[name].write_bytes(make_receipt(attempt.receipt, SIGNER))
    cosigned = sorted(size for size, _ in list_history(tmp_path / "log"))

    for name, attempt in (("first", first), ("second", second)):
        code, proof, err = _prove(tmp_path / "log", "--receipt", str(receipts[name]))
        assert code == 0, err
        parsed = TlogProof.parse(proof)
        assert parsed.index == attempt.dispatch.index
        assert parsed.extra is not None and b'"type":"dispatch"' in parsed.extra
        # the newest cosigned checkpoint covering it (the log's latest: a later one covers)
        assert f"\n{cosigned[-1]}\n".encode() in parsed.checkpoint
        assert _verify(tmp_path, proof, receipts[name]) == 0
        other = receipts["second" if name == "first" else "first"]
        assert _verify(tmp_path, proof, other) == 1  # not that receipt's entry

        code, by_index, err = _prove(tmp_path / "log", "--index", str(attempt.dispatch.index))
        assert code == 0, err
        assert by_index == proof

    code, completion, err = _prove(tmp_path / "log", "--index", str(first.completion.index))
    assert code == 0, err
    assert b'"type":"completion"' in (TlogProof.parse(completion).extra or b"")

    code, by_default, err = _prove(tmp_path / "log")
    assert code == 0, err
    assert TlogProof.parse(by_default).index == second.dispatch.index
    assert "2 dispatch records" in err


def test_prove_cosigned_against_a_checkpoint_below_the_latest(tmp_path: Path) -> None:
    """With the newest cosigned checkpoints gone but the first attempt's, the first
    attempt is proved against that one, and the second is refused (none covers it)."""
    first, second = _two_attempts(tmp_path / "log")
    receipt = tmp_path / "first.json"
    receipt.write_bytes(make_receipt(first.receipt, SIGNER))
    sizes = sorted(size for size, _ in list_history(tmp_path / "log"))
    keep = next(size for size in sizes if size > first.dispatch.index)
    assert keep <= second.dispatch.index
    for size in sizes:
        if size != keep:
            cosigned_path(tmp_path / "log", size).unlink()

    code, proof, err = _prove(tmp_path / "log", "--receipt", str(receipt))
    assert code == 0, err
    parsed = TlogProof.parse(proof)
    assert parsed.index == first.dispatch.index
    assert f"\n{keep}\n".encode() in parsed.checkpoint
    assert _verify(tmp_path, proof, receipt) == 0

    code, _, err = _prove(tmp_path / "log", "--index", str(second.dispatch.index))
    assert code == 1 and "no cosigned checkpoint covers entry" in err, err
