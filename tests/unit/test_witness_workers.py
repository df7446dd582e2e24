"""A witness of `owngate serve --workers N` logs: origin `<origin>/worker-<i>`, key `<origin>`.

`serve --workers N` gives worker i its own log, origin `<provenance.origin>/worker-<i>`,
signed with the configured key, whose name is `<provenance.origin>`
(`ProvenanceSettings.for_worker`). The witness looked a checkpoint's keys up by the key
name equal to the origin only, so it answered 404 `unknown_log` to every worker's
checkpoint (seen on a real `serve --workers 2` with a witness: `this witness does not
know the log '.../worker-1'`, no `cosigned/` ever written). `witness serve --workers N`
now takes those N logs for each `--log` key, and no other origin: not worker N+1, not a
number `serve` does not write (`01`, `+1`, a non-ASCII digit), not another name's workers.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from gateway.config.provenance import ProvenanceSettings
from gateway.provenance import ProvenanceLog, verify_log
from gateway.provenance.errors import KeyFormatError
from gateway.provenance.formats.checkpoint import Checkpoint, sign_checkpoint
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.layout import cosigned_path
from gateway.provenance.formats.merkle import EMPTY_ROOT
from gateway.provenance.testing import log_request, seeded_signer
from gateway.provenance.witness import witness as witness_module
from gateway.provenance.witness.witness import Witness
from tests.helpers.witness_rig import Refusal

ORIGIN = "gateway.example/log/workers"
LOG_SIGNER = seeded_signer(ORIGIN)  # named for the configured origin, as `keys new` makes it
COSIGNER = Cosigner(seeded_signer("witness.example/w1"))
NOW = 1_767_225_600


def worker_origin(index: int, tmp_path: Path) -> str:
    """The origin worker `index` of `serve --workers` signs, as the gateway computes it."""
    settings = ProvenanceSettings(dir="log", origin=ORIGIN, signing_key_file="log.key")
    return settings.for_worker(index, tmp_path).origin


def open_witness(path: Path, workers: int) -> Witness:
    verifiers = [LOG_SIGNER.verifier()]
    return Witness.open(path, COSIGNER, verifiers, clock=lambda: NOW, new=True, workers=workers)


def write_worker_log(directory: Path, origin: str) -> list[bytes]:
    """A worker's log of two requests; its checkpoints' notes (sizes 0 and 4)."""

    async def build() -> list[bytes]:
        log = await ProvenanceLog.open(directory, origin, LOG_SIGNER)
        first = log.latest_checkpoint()
        assert first is not None
        for number in range(2):
            await log_request(log, number)
        notes = [first.note, (await log.checkpoint()).note]
        await log.close()
        return notes

    return asyncio.run(build())


def empty_tree(origin: str) -> bytes:
    """A size-0 checkpoint of `origin`, signed by the workers' key; past the 255
    characters a checkpoint's origin may have, its note spelled out (the witness looks
    the origin up before it parses the rest)."""
    if len(origin) <= 255:
        return sign_checkpoint(Checkpoint(origin, 0, EMPTY_ROOT), [LOG_SIGNER])
    root = base64.b64encode(EMPTY_ROOT).decode()
    return f"{origin}\n0\n{root}\n\n\u2014 {ORIGIN} AAAAAA==\n".encode()


def test_each_workers_log_is_cosigned_and_audit_verify_accepts_it(tmp_path: Path) -> None:
    with open_witness(tmp_path / "w.json", workers=2) as witness:
        for index in (1, 2):
            origin = worker_origin(index, tmp_path)
            assert origin == f"{ORIGIN}/worker-{index}"
            logdir = tmp_path / f"worker-{index}"
            empty, grown = write_worker_log(logdir, origin)
            witness.add_checkpoint(0, [], empty)
            line = witness.add_checkpoint(0, [], grown)
            cosigned = cosigned_path(logdir, 4)
            cosigned.parent.mkdir()
            cosigned.write_bytes(grown + line)  # as the gateway's collector keeps it
            keys = [LOG_SIGNER.verifier()]
            summary = verify_log(logdir, keys, witnesses=[COSIGNER.vkey], now=NOW)
            assert summary.size == 4
            latest = witness.latest(origin)
            assert latest is not None and latest.size == 4


@pytest.mark.parametrize(
    "origin",
    [
        f"{ORIGIN}/worker-3",  # past --workers
        f"{ORIGIN}/worker-0",
        f"{ORIGIN}/worker-01",  # serve writes no leading zero
        f"{ORIGIN}/worker-+1",
        f"{ORIGIN}/worker-\u0661",  # ARABIC-INDIC DIGIT ONE: isdigit(), not serve's
        f"{ORIGIN}/worker-{'9' * 5000}",  # no int() of thousands of digits either
        f"{ORIGIN}/worker-1/worker-1",  # a worker of a worker: another name
        f"{ORIGIN}/worker-",
        f"{ORIGIN}/worker1",
        f"{ORIGIN}x/worker-1",  # a look-alike name
        f"{ORIGIN[:-1]}/worker-1",
        "gateway.example/log/other/worker-1",
    ],
)
def test_an_origin_it_was_not_configured_for_is_unknown(tmp_path: Path, origin: str) -> None:
    with open_witness(tmp_path / "w.json", workers=2) as witness, Refusal("unknown_log"):
        witness.add_checkpoint(0, [], empty_tree(origin))


def test_without_workers_a_workers_log_is_unknown_and_the_answer_says_why(tmp_path: Path) -> None:
    with open_witness(tmp_path / "w.json", workers=0) as witness, Refusal("unknown_log") as caught:
        witness.add_checkpoint(0, [], empty_tree(f"{ORIGIN}/worker-1"))
    assert "takes 0 `serve --workers` logs" in str(caught.error)


def test_a_workers_log_signed_by_another_key_is_untrusted(tmp_path: Path) -> None:
    """Only the `--log` key named for the workers' origin signs their logs: not a key named
    for the worker's own origin, not another configured log's key."""
    origin = f"{ORIGIN}/worker-1"
    other = seeded_signer("gateway.example/log/other", seed=3)
    own_name = seeded_signer(origin, seed=4)
    twin_name = seeded_signer(ORIGIN, seed=5)  # the same name, another key
    verifiers = [LOG_SIGNER.verifier(), other.verifier()]
    with Witness.open(tmp_path / "w.json", COSIGNER, verifiers, new=True, workers=2) as witness:
        for signer in (other, own_name, twin_name):
            note = sign_checkpoint(Checkpoint(origin, 0, EMPTY_ROOT), [signer])
            with Refusal("untrusted"):
                witness.add_checkpoint(0, [], note)


def test_workers_out_of_range_are_refused_before_the_state_is_made(tmp_path: Path) -> None:
    for workers in (-1, witness_module.MAX_WORKERS + 1):
        with pytest.raises(ValueError, match="workers"):
            open_witness(tmp_path / "w.json", workers=workers)
        assert not (tmp_path / "w.json").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_key_named_for_a_workers_origin_beside_the_workers_key_is_refused(
    tmp_path: Path, workers: int
) -> None:
    """Another log's operator whose key is named `ORIGIN/worker-1` would have that
    origin's tree in the witness state: its checkpoints cosigned as worker 1's log, the
    gateway's worker 1 then refused (untrusted, or a conflict with the tree it forked).
    The witness refuses to start with both keys, before its state is made."""
    intruder = seeded_signer(f"{ORIGIN}/worker-1", seed=4)
    verifiers = [LOG_SIGNER.verifier(), intruder.verifier()]
    with pytest.raises(KeyFormatError, match="worker-1"):
        Witness.open(tmp_path / "w.json", COSIGNER, verifiers, new=True, workers=workers)
    assert not (tmp_path / "w.json").exists()


def test_a_key_named_like_a_worker_past_workers_is_its_own_log(tmp_path: Path) -> None:
    """`ORIGIN/worker-3` beside `ORIGIN` with 2 workers names no worker's log: its key's."""
    other = seeded_signer(f"{ORIGIN}/worker-3", seed=4)
    verifiers = [LOG_SIGNER.verifier(), other.verifier()]
    with Witness.open(tmp_path / "w.json", COSIGNER, verifiers, new=True, workers=2) as witness:
        note = sign_checkpoint(Checkpoint(f"{ORIGIN}/worker-3", 0, EMPTY_ROOT), [other])
        witness.add_checkpoint(0, [], note)
