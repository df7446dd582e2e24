"""The witness (C2SP tlog-witness) and cosignatures (C2SP tlog-cosignature v1).

Layers: the pure core against real provenance logs (sequence, rollback, fork, bad proof,
unknown log, wrong old size, restart), the cosignature format against the spec's and
transparency-dev's vectors and the Tessera test log, the ASGI app on a real uvicorn
socket with the standard-library client, and the CLI in a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.cli import witness as witness_cli
from gateway.provenance import (
    Checkpoint,
    MalformedError,
    SignatureError,
    Verifier,
    load_signer,
    open_checkpoint,
    open_note,
    sign_checkpoint,
    write_signing_key,
)
from gateway.provenance.errors import KeyFormatError
from gateway.provenance.formats.cosignature import (
    CosignatureVerifier,
    Cosigner,
    attach_cosignatures,
    cosigned_message,
    parse_cosignature_line,
    verify_cosignature,
)
from gateway.provenance.formats.merkle import consistency_proof, leaf_hash, root_from_leaves
from gateway.provenance.formats.tiles import TileReader
from gateway.provenance.testing import seeded_signer
from gateway.provenance.witness.app import create_witness_app
from gateway.provenance.witness.client import WitnessClient, request_cosignature
from gateway.provenance.witness.state import StateLockedError, TreeHead, WitnessState
from gateway.provenance.witness.witness import MAX_PROOF_LINES, AddCheckpoint, Witness, WitnessError
from gateway.serving import ServerThread
from tests.helpers.net import free_port
from tests.helpers.paths import VECTORS
from tests.helpers.waiting import until
from tests.helpers.witness_rig import (
    COSIGNER,
    LOG_SIGNER,
    NOW,
    ORIGIN,
    WITNESS_SIGNER,
    RealLog,
    Refusal,
    answer_once,
    cosign_up_to,
    make_log,
    open_witness,
    real_log,
    witness,
)

__all__ = ["real_log", "witness"]  # fixtures, used by name

TESSERA = VECTORS / "tessera-log"
TESSERA_VKEY = "example.com/log/testdata+33d7b496+AeHTu4Q3hEIMHNqc6fASMsq3rKNx280NI+oO5xCFkkSx"


# --- the core against a real log -------------------------------------------------------------


def test_cosigns_a_real_logs_checkpoints_in_sequence(witness: Witness, real_log: RealLog) -> None:
    assert real_log.sizes == [0, 2, 6, 10]
    old = 0
    for number, note in enumerate(real_log.notes):
        size = real_log.sizes[number]
        line = witness.add_checkpoint(old, real_log.proof(old, size), note)
        assert line.startswith("\u2014 witness.example/w1 ".encode()) and line.endswith(b"\n")
        cosigned = note + line
        cosignature = verify_cosignature(cosigned, COSIGNER.vkey, now=NOW)
        assert (cosignature.timestamp, cosignature.name) == (NOW, "witness.example/w1")
        # The log's signature still verifies; the cosignature is an unknown key to it.
        opened = open_note(cosigned, [LOG_SIGNER.verifier()])
        assert [s.name for s in opened.unverified] == ["witness.example/w1"]
        checkpoint = real_log.checkpoint(number)
        assert witness.latest(ORIGIN) == TreeHead(size, checkpoint.root)
        old = size


def test_resubmitting_the_cosigned_checkpoint_is_cosigned_again(
    witness: Witness, real_log: RealLog
) -> None:
    cosign_up_to(witness, real_log, 2)
    again = witness.add_checkpoint(6, [], real_log.notes[2])
    verify_cosignature(real_log.notes[2] + again, COSIGNER.vkey, now=NOW)


def test_rollback_is_refused(witness: Witness, real_log: RealLog) -> None:
    cosign_up_to(witness, real_log, 3)  # size 10
    with Refusal("malformed") as caught:  # old size above the checkpoint's: the spec's 400
        witness.add_checkpoint(10, [], real_log.notes[2])
    assert "rollback" in str(caught.error)
    with Refusal("conflict") as caught:  # the honest old size for the smaller tree: 409
        witness.add_checkpoint(2, real_log.proof(2, 6), real_log.notes[2])
    assert caught.error is not None and caught.error.known_size == 10
    assert witness.latest(ORIGIN) == TreeHead(10, real_log.checkpoint(3).root)


def test_fork_is_refused(witness: Witness, real_log: RealLog, tmp_path: Path) -> None:
    # Same origin, same key, same sizes, other records: a split view of the log.
    fork = make_log(tmp_path / "fork", tenants=("someone-else",) * 3)
    assert fork.sizes == real_log.sizes and fork.checkpoint(2).root != real_log.checkpoint(2).root
    cosign_up_to(witness, real_log, 2)  # size 6
    with Refusal("conflict") as caught:  # same size, another root
        witness.add_checkpoint(6, [], fork.notes[2])
    assert caught.error is not None and caught.error.known_size == 6
    assert "fork" in str(caught.error)
    with Refusal("inconsistent"):  # a bigger forked tree has no proof from the cosigned one
        witness.add_checkpoint(6, fork.proof(6, 10), fork.notes[3])
    assert witness.latest(ORIGIN) == TreeHead(6, real_log.checkpoint(2).root)


def test_bad_proof_is_refused_and_changes_nothing(witness: Witness, real_log: RealLog) -> None:
    cosign_up_to(witness, real_log, 1)  # size 2
    proof = real_log.proof(2, 10)
    for position in range(len(proof)):
        bad = list(proof)
        bad[position] = bytes([bad[position][0] ^ 1]) + bad[position][1:]
        with Refusal("inconsistent"):
            witness.add_checkpoint(2, bad, real_log.notes[3])
    with Refusal("inconsistent"):  # one hash short
        witness.add_checkpoint(2, proof[:-1], real_log.notes[3])
    with Refusal("inconsistent"):  # a proof where none belongs
        witness.add_checkpoint(2, [proof[0]], real_log.notes[1])
    assert witness.latest(ORIGIN) == TreeHead(2, real_log.checkpoint(1).root)
    witness.add_checkpoint(2, proof, real_log.notes[3])  # the right proof still works


def test_unknown_log_and_untrusted_signatures(witness: Witness, real_log: RealLog) -> None:
    stranger = seeded_signer("other.example/log")
    other = Checkpoint("other.example/log", 0, root_from_leaves([]))
    with Refusal("unknown_log"):
        witness.add_checkpoint(0, [], sign_checkpoint(other, [stranger]))
    impostor = seeded_signer(ORIGIN, seed=2)  # the right origin, another key
    forged = sign_checkpoint(real_log.checkpoint(3), [impostor])
    with Refusal("untrusted"):
        witness.add_checkpoint(0, [], forged)
    tampered = real_log.notes[3].replace(b"\n10\n", b"\n11\n")
    with Refusal("untrusted"):
        witness.add_checkpoint(0, [], tampered)
    assert witness.latest(ORIGIN) is None


def test_wrong_old_size_is_a_conflict_carrying_the_known_size(
    witness: Witness, real_log: RealLog
) -> None:
    with Refusal("conflict") as caught:  # never cosigned: the witness knows size 0
        witness.add_checkpoint(2, real_log.proof(2, 6), real_log.notes[2])
    assert caught.error is not None and caught.error.known_size == 0
    cosign_up_to(witness, real_log, 2)
    with Refusal("conflict") as caught:  # old 0 is how a log asks what the witness knows
        witness.add_checkpoint(0, [], real_log.notes[3])
    assert caught.error is not None and caught.error.known_size == 6


def test_empty_tree_and_proofs_from_size_zero(witness: Witness, real_log: RealLog) -> None:
    with Refusal("inconsistent"):
        witness.add_checkpoint(0, [b"\x00" * 32], real_log.notes[1])
    bogus = sign_checkpoint(Checkpoint(ORIGIN, 0, b"\x01" * 32), [LOG_SIGNER])
    with Refusal("inconsistent"):
        witness.add_checkpoint(0, [], bogus)
    witness.add_checkpoint(0, [], real_log.notes[0])  # the real empty tree
    witness.add_checkpoint(0, [], real_log.notes[2])  # from 0 nothing needs proving


def test_state_survives_a_restart(tmp_path: Path, real_log: RealLog) -> None:
    state = tmp_path / "witness.json"
    with open_witness(state) as first:
        cosign_up_to(first, real_log, 2)
        with pytest.raises(StateLockedError, match="another witness process"):
            open_witness(state)
    saved = json.loads(state.read_text())
    root = base64.b64encode(real_log.checkpoint(2).root).decode()
    key = [str(LOG_SIGNER)]  # the log's keys that signed, for key rotations
    assert saved == {
        "v": 1,
        "logs": {ORIGIN: {"size": 6, "root": root, "keys": key, "seen": key, "time": NOW}},
    }
    with open_witness(state, clock=NOW + 60, new=False) as second:
        assert second.latest(ORIGIN) == TreeHead(6, real_log.checkpoint(2).root)
        with Refusal("conflict"):
            second.add_checkpoint(2, real_log.proof(2, 6), real_log.notes[2])
        line = second.add_checkpoint(6, real_log.proof(6, 10), real_log.notes[3])
        assert verify_cosignature(real_log.notes[3] + line, COSIGNER.vkey, now=NOW).timestamp == (
            NOW + 60
        )


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{}", "needs 'v' and 'logs'"),
        (b"not json", "invalid JSON"),
        (b'{"v": 2, "logs": {}}', "version 2"),
        (b'{"v": 1, "logs": {"o": {"size": -1, "root": ""}}}', "size"),
        (b'{"v": 1, "logs": {"o": {"size": 1, "root": "AAAA"}}}', "32-byte"),
    ],
)
def test_a_damaged_state_file_is_refused_not_reset(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    state = tmp_path / "witness.json"
    state.write_bytes(content)
    with pytest.raises(MalformedError, match=reason):
        WitnessState.open(state)
    WitnessState.open(state.with_name("fresh.json"), new=True).close()  # a new witness


def test_concurrent_submissions_never_roll_back(tmp_path: Path, real_log: RealLog) -> None:
    """Check-then-persist is atomic: racing requests never leave the state below a success."""
    with open_witness(tmp_path / "witness.json") as witness:
        pairs = [(old, new) for old in (0, 2, 6) for new in (2, 6, 10) if old <= new]
        index = dict(zip(real_log.sizes, range(4), strict=True))
        accepted: list[int] = []
        unexpected: list[WitnessError] = []

        def submit(old: int, new: int) -> None:
            for _ in range(20):
                try:
                    witness.add_checkpoint(
                        old, real_log.proof(old, new), real_log.notes[index[new]]
                    )
                    accepted.append(new)
                except WitnessError as error:
                    if error.code != "conflict":
                        unexpected.append(error)

        threads = [threading.Thread(target=submit, args=pair) for pair in pairs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert unexpected == []
        latest = witness.latest(ORIGIN)
        assert latest is not None and latest.size == max(accepted)


# --- the request body ------------------------------------------------------------------------


def test_request_body_round_trips(real_log: RealLog) -> None:
    request = AddCheckpoint(2, tuple(real_log.proof(2, 10)), real_log.notes[3])
    body = request.encode()
    assert body.startswith(b"old 2\n") and b"\n\n" + real_log.notes[3] in body
    assert AddCheckpoint.parse(body) == request
    empty = AddCheckpoint(0, (), real_log.notes[1])
    assert empty.encode() == b"old 0\n\n" + real_log.notes[1]
    assert AddCheckpoint.parse(empty.encode()) == empty


HASH = base64.b64encode(b"\x00" * 32)


@pytest.mark.parametrize(
    "head",
    [
        b"old 01",
        b"old -1",
        b"old 1 ",
        b"OLD 1",
        b"old 1\nnot base64!",
        b"old 1\n" + base64.b64encode(b"\x00" * 31),
        b"old 1\n" + b"\n".join([HASH] * (MAX_PROOF_LINES + 1)),
        b"old 1\n\xff",
    ],
)
def test_malformed_request_bodies(head: bytes, real_log: RealLog) -> None:
    with Refusal("malformed"):
        AddCheckpoint.parse(head + b"\n\n" + real_log.notes[1])


def test_a_body_without_note_is_malformed() -> None:
    for body in (b"old 0\n", b"old 0\n\n", b""):
        with Refusal("malformed"):
            AddCheckpoint.parse(body)


# --- cosignatures ----------------------------------------------------------------------------


def _cosigned(real_log: RealLog, witness: Witness) -> bytes:
    return real_log.notes[1] + witness.add_checkpoint(0, [], real_log.notes[1])


def test_a_cosignature_is_a_timestamped_ed25519_signature_over_the_spec_message(
    witness: Witness, real_log: RealLog
) -> None:
    cosigned = _cosigned(real_log, witness)
    line = cosigned.decode().rsplit("\n", 2)[-2]
    cosignature = parse_cosignature_line(line)
    blob = base64.b64decode(line.split(" ")[-1])
    assert len(blob) == 4 + 8 + 64
    assert blob[:4] == COSIGNER.key_id.to_bytes(4, "big")
    assert int.from_bytes(blob[4:12], "big") == NOW == cosignature.timestamp
    text = real_log.notes[1].decode().split("\n\n")[0] + "\n"
    message = f"cosignature/v1\ntime {NOW}\n{text}".encode()
    assert cosigned_message(text, NOW) == message
    Ed25519PublicKey.from_public_bytes(COSIGNER.public_key).verify(blob[12:], message)


def test_every_flipped_byte_of_a_cosignature_fails(witness: Witness, real_log: RealLog) -> None:
    cosigned = _cosigned(real_log, witness)
    note, _, line = cosigned[:-1].rpartition(b"\n")
    prefix, _, encoded = line.rpartition(b" ")
    blob = base64.b64decode(encoded)
    for position in range(len(blob)):
        flipped = bytearray(blob)
        flipped[position] ^= 0x01
        bad = note + b"\n" + prefix + b" " + base64.b64encode(bytes(flipped)) + b"\n"
        with pytest.raises((SignatureError, MalformedError)):
            verify_cosignature(bad, COSIGNER.vkey, now=NOW)
    edited = cosigned.replace(b"\n2\n", b"\n3\n")
    with pytest.raises(SignatureError, match="invalid cosignature"):
        verify_cosignature(edited, COSIGNER.vkey, now=NOW)


def test_verify_cosignature_needs_the_witness_key_and_a_sane_time(
    witness: Witness, real_log: RealLog
) -> None:
    cosigned = _cosigned(real_log, witness)
    other = Cosigner(seeded_signer("witness.example/w1", seed=9))
    with pytest.raises(SignatureError, match="no cosignature by witness"):
        verify_cosignature(cosigned, other.vkey, now=NOW)
    with pytest.raises(SignatureError, match="no cosignature by witness"):
        verify_cosignature(real_log.notes[1], COSIGNER.vkey, now=NOW)
    with pytest.raises(SignatureError, match="after now"):
        verify_cosignature(cosigned, COSIGNER.vkey, now=NOW - 301)
    verify_cosignature(cosigned, COSIGNER.vkey, now=NOW - 299)
    # The witness key's plain note verifier key (0x01) names the same key.
    assert CosignatureVerifier(WITNESS_SIGNER.vkey).vkey == COSIGNER.vkey
    verify_cosignature(cosigned, WITNESS_SIGNER.vkey, now=NOW)


def test_a_note_signature_by_the_witness_key_is_not_a_cosignature(real_log: RealLog) -> None:
    text = real_log.notes[1].decode().split("\n\n")[0] + "\n"
    plain = sign_checkpoint(Checkpoint.parse(text), [WITNESS_SIGNER])  # 0x01, no timestamp
    with pytest.raises(SignatureError, match="no cosignature by witness"):
        verify_cosignature(plain, COSIGNER.vkey, now=NOW)
    cosigned = real_log.notes[1] + COSIGNER.cosign(text, NOW).line().encode()
    with pytest.raises(SignatureError, match="no signature by a trusted key"):
        open_note(cosigned, [WITNESS_SIGNER.verifier()])  # and the reverse


def test_extension_lines_are_cosigned(tmp_path: Path) -> None:
    leaves = [leaf_hash(b"a"), leaf_hash(b"b")]
    checkpoint = Checkpoint(ORIGIN, 2, root_from_leaves(leaves), ("extension line",))
    note = sign_checkpoint(checkpoint, [LOG_SIGNER])
    with open_witness(tmp_path / "w.json") as witness:
        cosigned = note + witness.add_checkpoint(0, [], note)
    verify_cosignature(cosigned, COSIGNER.vkey, now=NOW)
    with pytest.raises(SignatureError):
        verify_cosignature(
            cosigned.replace(b"extension line", b"extension LINE"), COSIGNER.vkey, now=NOW
        )


def test_attach_keeps_only_verified_lines_by_the_witness(
    witness: Witness, real_log: RealLog
) -> None:
    line = witness.add_checkpoint(0, [], real_log.notes[1])
    stranger = Cosigner(seeded_signer("stranger.example/w9")).cosign(
        real_log.notes[1].decode().split("\n\n")[0] + "\n", NOW
    )
    answer = stranger.line().encode() + line
    assert attach_cosignatures(real_log.notes[1], answer, COSIGNER.vkey, now=NOW) == (
        real_log.notes[1] + line
    )
    with pytest.raises(SignatureError):
        attach_cosignatures(real_log.notes[1], stranger.line().encode(), COSIGNER.vkey, now=NOW)


# --- vectors ---------------------------------------------------------------------------------

COSIGNATURE_VECTORS = json.loads((VECTORS / "cosignature" / "cosignature.json").read_text())


def test_spec_example_framing_and_signed_message() -> None:
    example = COSIGNATURE_VECTORS["spec_example"]
    lines = example["note"].split("\n\n")[1].splitlines()
    cosignature = parse_cosignature_line(lines[1])
    assert cosignature.name == example["witness_name"]
    assert f"{cosignature.key_id:08x}" == example["witness_key_id"]
    assert cosignature.timestamp == example["timestamp"]
    assert cosignature.line() == lines[1] + "\n"  # re-encodes byte for byte
    text = example["note"].split("\n\n")[0] + "\n"
    assert cosigned_message(text, example["timestamp"]) == example["signed_message"].encode()


@pytest.mark.parametrize(
    "case", COSIGNATURE_VECTORS["verifier_keys"], ids=lambda case: str(case["desc"])
)
def test_transparency_dev_verifier_keys(case: dict[str, Any]) -> None:
    if case["wantErr"]:
        with pytest.raises(KeyFormatError):
            CosignatureVerifier(case["vkey"])
        return
    verifier = CosignatureVerifier(case["vkey"])
    assert verifier.name == case["vkey"].split("+")[0]
    if case["vkey"].split("+", 2)[2].startswith("B"):  # native 0x04: the key id is kept
        assert verifier.vkey == case["vkey"]


@pytest.mark.parametrize(
    "case", COSIGNATURE_VECTORS["timestamps"], ids=lambda case: str(case["desc"])
)
def test_transparency_dev_cosignature_timestamps(case: dict[str, Any]) -> None:
    line = f"\u2014 witness.example {case['signature']}"
    if case["wantErr"]:
        with pytest.raises(MalformedError):
            parse_cosignature_line(line)
        return
    assert parse_cosignature_line(line).timestamp == case["timestamp"]


def test_witness_cosigns_the_tessera_test_log(tmp_path: Path) -> None:
    """Checkpoints and tiles written by another implementation (transparency-dev/tessera)."""
    notes = [(TESSERA / f"checkpoint.{size}").read_bytes() for size in range(16)]
    with Witness.open(
        tmp_path / "w.json", COSIGNER, [Verifier(TESSERA_VKEY)], clock=lambda: NOW, new=True
    ) as witness:
        old = 0
        for size in (0, 1, 2, 3, 7, 8, 9, 15):
            proof = consistency_proof(old, size, TileReader(TESSERA, size).node) if old else []
            line = witness.add_checkpoint(old, proof, notes[size])
            verify_cosignature(notes[size] + line, COSIGNER.vkey, now=NOW)
            old = size
        with Refusal("malformed"):  # rollback to 14
            witness.add_checkpoint(15, [], notes[14])


# --- HTTP on a real socket -------------------------------------------------------------------


@pytest.fixture
def server(witness: Witness) -> Iterator[ServerThread]:
    with ServerThread(create_witness_app(witness)) as started:
        yield started


def _post(url: str, body: bytes, path: str = "/add-checkpoint") -> httpx.Response:
    return httpx.post(url + path, content=body, timeout=10)


def test_http_statuses_follow_the_spec(
    server: ServerThread, real_log: RealLog, tmp_path: Path
) -> None:
    ok = _post(server.url, AddCheckpoint(0, (), real_log.notes[2]).encode())
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
    verify_cosignature(real_log.notes[2] + ok.content, COSIGNER.vkey, now=NOW)

    conflict = _post(server.url, AddCheckpoint(2, (), real_log.notes[3]).encode())
    assert conflict.status_code == 409
    assert conflict.headers["content-type"] == "text/x.tlog.size"
    assert conflict.content == b"6\n"

    proof = real_log.proof(6, 10)
    bad = (bytes([proof[0][0] ^ 1]) + proof[0][1:], *proof[1:])
    assert _post(server.url, AddCheckpoint(6, bad, real_log.notes[3]).encode()).status_code == 422
    forged = sign_checkpoint(real_log.checkpoint(3), [seeded_signer(ORIGIN, seed=2)])
    assert _post(server.url, AddCheckpoint(6, (), forged).encode()).status_code == 403
    other = sign_checkpoint(Checkpoint("x.example/log", 0, root_from_leaves([])), [LOG_SIGNER])
    assert _post(server.url, AddCheckpoint(0, (), other).encode()).status_code == 404
    assert _post(server.url, b"old 6\n").status_code == 400
    assert _post(server.url, AddCheckpoint(10, (), real_log.notes[2]).encode()).status_code == 400
    assert httpx.get(server.url + "/add-checkpoint").status_code == 405
    assert _post(server.url, b"", path="/elsewhere").status_code == 404
    assert _post(server.url, b"x" * (300 * 1024)).status_code == 413

    good = _post(server.url, AddCheckpoint(6, tuple(proof), real_log.notes[3]).encode())
    assert good.status_code == 200


def test_client_request_cosignature_over_a_socket(server: ServerThread, real_log: RealLog) -> None:
    async def scenario() -> None:
        lines = await request_cosignature(server.url, 0, [], real_log.notes[2], timeout=5)
        verify_cosignature(real_log.notes[2] + lines, COSIGNER.vkey, now=NOW)
        with Refusal("conflict") as caught:
            await request_cosignature(server.url, 0, [], real_log.notes[3], timeout=5)
        assert caught.error is not None and caught.error.known_size == 6
        with Refusal("inconsistent"):
            await request_cosignature(server.url, 6, [b"\x00" * 32], real_log.notes[3], timeout=5)

    asyncio.run(scenario())


def test_witness_client_learns_the_size_and_cosigns_in_order(
    server: ServerThread, real_log: RealLog
) -> None:
    async def prove(old: int, new: int) -> Sequence[bytes]:
        return real_log.proof(old, new)

    async def scenario() -> None:
        client = WitnessClient(server.url, COSIGNER.vkey, timeout=5, clock=lambda: NOW)
        for number in (1, 2):
            cosigned = await client.cosign(real_log.notes[number], real_log.sizes[number], prove)
            verify_cosignature(cosigned, COSIGNER.vkey, now=NOW)
            open_checkpoint(cosigned, [LOG_SIGNER.verifier()])
        assert client.old_size == 6
        # A client that lost track (a gateway restart) starts at 0, learns 6 from the 409.
        fresh = WitnessClient(server.url, WITNESS_SIGNER.vkey, timeout=5, clock=lambda: NOW)
        cosigned = await fresh.cosign(real_log.notes[3], 10, prove)
        verify_cosignature(cosigned, COSIGNER.vkey, now=NOW)
        assert fresh.old_size == 10
        with Refusal("conflict"):  # the witness is past this checkpoint: no retry helps
            await WitnessClient(server.url, COSIGNER.vkey, timeout=5).cosign(
                real_log.notes[2], 6, prove
            )

    asyncio.run(scenario())


def test_client_reports_an_unreachable_or_silent_witness() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    async def scenario() -> None:
        with Refusal("unavailable"):  # bound, not listening: refused
            await request_cosignature(f"http://127.0.0.1:{port}", 0, [], b"x\n", timeout=2)
        listener.listen(1)  # accepts the connection, never answers
        with Refusal("unavailable") as caught:
            await request_cosignature(f"http://127.0.0.1:{port}", 0, [], b"x\n", timeout=0.2)
        assert "did not answer" in str(caught.error)

    try:
        asyncio.run(scenario())
    finally:
        listener.close()


def test_client_reads_chunked_answers_and_maps_other_statuses(real_log: RealLog) -> None:
    line = COSIGNER.cosign(real_log.notes[1].decode().split("\n\n")[0] + "\n", NOW).line()
    payload = line.encode()
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (10, payload[:10])
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload) - 10, payload[10:])
    )

    async def scenario() -> None:
        server, url = await answer_once(chunked)
        async with server:
            lines = await request_cosignature(url, 0, [], real_log.notes[1], timeout=5)
        assert lines == payload
        for reply, code in [
            (b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom", "unavailable"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nhi\n", "unavailable"),
            (b"HTTP/1.1 404 Not Found\r\n\r\nunknown log\n", "unknown_log"),
            (b"garbage\r\n\r\n", "unavailable"),
        ]:
            server, url = await answer_once(reply)
            async with server:
                with Refusal(code):
                    await request_cosignature(url, 0, [], real_log.notes[1], timeout=5)

    asyncio.run(scenario())


# --- the command line ------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="owngate")
    witness_cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_cli_vkey_prints_the_cosignature_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "witness.key"
    printed = write_signing_key(key, "witness.example/w2")  # what `owngate keys new` does
    args = _parser().parse_args(["witness", "vkey", "--key", str(key)])
    assert args.handler(args) == 0
    vkey = capsys.readouterr().out.strip()
    assert vkey == CosignatureVerifier(printed).vkey
    assert base64.b64decode(vkey.split("+", 2)[2])[0] == 0x04  # the cosignature algorithm
    missing = _parser().parse_args(["witness", "vkey", "--key", str(tmp_path / "none")])
    assert missing.handler(missing) == 1


def test_cli_usage_errors_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KEY", "LOG", "STATE"):
        monkeypatch.delenv(f"OWNGATE_WITNESS_{name}", raising=False)
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["witness", "serve", "--key", "k", "--state", "s"])  # no --log
    assert exited.value.code == 2
    args = _parser().parse_args(["witness"])
    assert args.handler(args) == 2


def test_cli_serve_refuses_no_logs_and_a_damaged_state(tmp_path: Path) -> None:
    key = tmp_path / "witness.key"
    write_signing_key(key, "witness.example/w4")
    empty = tmp_path / "no-keys.txt"
    empty.write_text("\n")
    state = tmp_path / "state.json"
    serve = ["witness", "serve", "--key", str(key), "--state", str(state), "--port", "1"]
    args = _parser().parse_args([*serve, "--log", str(empty)])
    assert args.handler(args) == 2
    state.write_text("{")
    args = _parser().parse_args([*serve, "--log", LOG_SIGNER.vkey])
    assert args.handler(args) == 1  # never an empty state in place of a damaged one


_RUN_CLI = textwrap.dedent(
    """
    import argparse, sys
    from gateway.cli import witness
    parser = argparse.ArgumentParser(prog="owngate")
    witness.register(parser.add_subparsers())
    args = parser.parse_args(sys.argv[1:])
    sys.exit(args.handler(args))
    """
)


def test_cli_serve_cosigns_over_http_and_persists_its_state(
    tmp_path: Path, real_log: RealLog
) -> None:
    key = tmp_path / "witness.key"
    write_signing_key(key, "witness.example/w3")
    vkey = Cosigner(load_signer(key)).vkey
    state = tmp_path / "state.json"
    port = free_port()
    env = {
        **os.environ,
        "OWNGATE_WITNESS_KEY": str(key),
        "OWNGATE_WITNESS_LOG": LOG_SIGNER.vkey,
        "OWNGATE_WITNESS_STATE": str(state),
        "OWNGATE_WITNESS_PORT": str(port),
    }
    init = [sys.executable, "-c", _RUN_CLI, "witness", "init"]
    subprocess.run(init, env=env, check=True, capture_output=True, timeout=60)
    process = subprocess.Popen(
        [sys.executable, "-c", _RUN_CLI, "witness", "serve"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        answers: list[httpx.Response] = []

        def answered() -> bool:
            try:
                answers.append(_post(url, AddCheckpoint(0, (), real_log.notes[2]).encode()))
            except httpx.TransportError:
                return False
            return True

        until(answered, "the witness answering", timeout=15.0, interval=0.05)
        (answer,) = answers
        assert answer.status_code == 200
        verify_cosignature(real_log.notes[2] + answer.content, vkey, now=time.time())
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert vkey in stderr and ORIGIN in stderr
    assert json.loads(state.read_text())["logs"][ORIGIN]["size"] == 6


def test_witness_modules_import_no_server_stack() -> None:
    code = (
        "import sys\n"
        "import gateway.provenance.witness.witness, gateway.provenance.witness.app\n"
        "import gateway.provenance.witness.client, gateway.provenance.formats.cosignature\n"
        "import gateway.cli.witness\n"
        "bad = ('uvicorn', 'starlette', 'fastapi', 'redis', 'httpx', 'litellm', 'httptools')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in bad)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""
