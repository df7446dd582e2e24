"""The witness as a hostile log operator, a network attacker and a bad day see it: its
memory (the state file) across restarts, crashes, deletion and clock steps, the spec's
refusals over HTTP, racing submissions, and answers or cosigned files that sign
something else. The helpers and the real logs come from `test_witness` and
`test_cosigning`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import threading
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
import uvicorn

from gateway.cli import witness as witness_cli
from gateway.provenance import (
    LogVerificationError,
    MalformedError,
    SignatureError,
    verify_log,
    write_signing_key,
)
from gateway.provenance.formats.cosignature import (
    Cosignature,
    parse_cosignature_line,
    verify_cosignature,
)
from gateway.provenance.formats.layout import cosigned_path
from gateway.provenance.witness import state as witness_state
from gateway.provenance.witness.app import create_witness_app
from gateway.provenance.witness.client import WitnessClient
from gateway.provenance.witness.state import StateLockedError, TreeHead, WitnessState
from gateway.provenance.witness.witness import AddCheckpoint, Witness, WitnessError
from gateway.serving import ServerThread
from tests.helpers.cosigned_rig import LOG_SIGNER as COSIGNED_LOG_SIGNER
from tests.helpers.cosigned_rig import W1, copy_log, witnessed_log
from tests.helpers.witness_rig import (  # the fixtures are used by name
    COSIGNER,
    LOG_SIGNER,
    NOW,
    ORIGIN,
    RealLog,
    Refusal,
    answer_once,
    cosign_up_to,
    make_log,
    open_witness,
    real_log,
)

__all__ = ["real_log", "witnessed_log"]


def _timestamp(note: bytes, line: bytes) -> int:
    return verify_cosignature(note + line, COSIGNER.vkey, now=NOW + 10**6).timestamp


# --- the state file ----------------------------------------------------------------------------


def test_cosignature_timestamps_never_go_back(tmp_path: Path, real_log: RealLog) -> None:
    """A cosignature says its tree was the largest seen as of its time: a larger tree dated
    before a smaller one (the clock stepped back, a restart with a slow clock) would say
    the log shrank. Each is dated no earlier than the last, across restarts too."""
    state = tmp_path / "witness.json"
    clock = [float(NOW)]
    with Witness.open(
        state, COSIGNER, [LOG_SIGNER.verifier()], clock=lambda: clock[0], new=True
    ) as witness:
        first = _timestamp(real_log.notes[1], witness.add_checkpoint(0, [], real_log.notes[1]))
        clock[0] = NOW - 3600  # NTP steps the clock back an hour
        line = witness.add_checkpoint(2, real_log.proof(2, 6), real_log.notes[2])
        assert _timestamp(real_log.notes[2], line) == first == NOW
        again = witness.add_checkpoint(6, [], real_log.notes[2])  # the same tree, asked again
        assert _timestamp(real_log.notes[2], again) == NOW
    assert json.loads(state.read_text())["logs"][ORIGIN]["time"] == NOW
    with open_witness(state, clock=NOW - 7200, new=False) as restarted:
        line = restarted.add_checkpoint(6, real_log.proof(6, 10), real_log.notes[3])
        assert _timestamp(real_log.notes[3], line) == NOW
    with open_witness(state, clock=NOW + 5, new=False) as later:  # time moves on as usual
        assert _timestamp(real_log.notes[3], later.add_checkpoint(10, [], real_log.notes[3])) == (
            NOW + 5
        )


def test_a_missing_state_file_is_refused_not_a_new_witness(
    tmp_path: Path, real_log: RealLog
) -> None:
    """A witness whose state vanished (a wiped volume, a typo in `--state`) would cosign
    a rollback or a fork of every log it witnessed: it refuses to start instead."""
    state = tmp_path / "witness.json"
    with open_witness(state) as witness:
        cosign_up_to(witness, real_log, 3)  # size 10
    state.unlink()
    with pytest.raises(witness_state.StateMissingError, match="witness init"):
        open_witness(state, new=False)
    with pytest.raises(witness_state.StateMissingError):
        WitnessState.open(state)
    assert not state.exists()  # nothing was created in its place


def test_a_new_state_is_never_made_over_an_existing_one(tmp_path: Path, real_log: RealLog) -> None:
    state = tmp_path / "witness.json"
    with open_witness(state) as witness:
        cosign_up_to(witness, real_log, 2)  # size 6
    saved = state.read_bytes()
    with pytest.raises(witness_state.StateExistsError, match="already exists"):
        open_witness(state, new=True)
    assert state.read_bytes() == saved
    with open_witness(state, new=False) as reopened:
        assert reopened.latest(ORIGIN) == TreeHead(6, real_log.checkpoint(2).root)


def test_every_name_of_the_state_file_shares_its_lock(tmp_path: Path) -> None:
    """Two witness processes on one state could each roll the other back; one reaching
    the file through a symlink took a lock of its own, and its writes replaced the link."""
    real = tmp_path / "data" / "witness.json"
    real.parent.mkdir()
    WitnessState.open(real, new=True).close()
    link = tmp_path / "witness-link.json"
    link.symlink_to(real)
    with WitnessState.open(real), pytest.raises(StateLockedError):
        WitnessState.open(link)
    with WitnessState.open(link) as through_link:
        through_link.update(ORIGIN, TreeHead(1, b"\x01" * 32))
    assert link.is_symlink()  # the write went to the file, the link still names it
    assert json.loads(real.read_text())["logs"][ORIGIN]["size"] == 1


def test_a_crash_mid_write_leaves_the_old_state(tmp_path: Path, real_log: RealLog) -> None:
    """A crash between writing the temporary file and renaming it: the state read on
    restart is the last complete one, and the half-written file is replaced next time."""
    state = tmp_path / "witness.json"
    with open_witness(state) as witness:
        cosign_up_to(witness, real_log, 1)  # size 2
    state.with_name(state.name + ".tmp").write_bytes(b'{"v": 1, "logs": {"' + ORIGIN.encode())
    with open_witness(state, new=False) as restarted:
        assert restarted.latest(ORIGIN) == TreeHead(2, real_log.checkpoint(1).root)
        with Refusal("conflict"):  # still remembers: no rollback to a fresh witness
            restarted.add_checkpoint(0, [], real_log.notes[1])
        restarted.add_checkpoint(2, real_log.proof(2, 6), real_log.notes[2])
    assert not state.with_name(state.name + ".tmp").exists()
    assert json.loads(state.read_text())["logs"][ORIGIN]["size"] == 6


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        ({"time": -1}, "time"),
        ({"time": True}, "time"),
        ({"time": 2**63}, "time"),
        ({"keys": []}, "needs exactly"),  # keys without seen
        ({"extra": 1}, "needs exactly"),
    ],
)
def test_a_bad_time_or_field_in_the_state_is_refused(
    tmp_path: Path, head: dict[str, object], reason: str
) -> None:
    root = base64.b64encode(b"\x00" * 32).decode()
    state = tmp_path / "witness.json"
    state.write_text(json.dumps({"v": 1, "logs": {ORIGIN: {"size": 1, "root": root, **head}}}))
    with pytest.raises(MalformedError, match=reason):
        WitnessState.open(state)


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_a_state_version_other_than_the_integer_1_is_refused(
    tmp_path: Path, version: object
) -> None:
    # Before: `true` and `1.0` compared equal to 1 and loaded, as receipts' `v` did (a
    # state another tool writes, or reads as an integer, is then one file, two readings).
    root = base64.b64encode(b"\x00" * 32).decode()
    state = tmp_path / "witness.json"
    state.write_text(json.dumps({"v": version, "logs": {ORIGIN: {"size": 1, "root": root}}}))
    with pytest.raises(MalformedError, match="witness state version"):
        WitnessState.open(state)


def test_an_older_state_file_without_time_still_loads(tmp_path: Path, real_log: RealLog) -> None:
    root = base64.b64encode(real_log.checkpoint(2).root).decode()
    state = tmp_path / "witness.json"
    state.write_text(json.dumps({"v": 1, "logs": {ORIGIN: {"size": 6, "root": root}}}))
    with open_witness(state, new=False) as witness:
        line = witness.add_checkpoint(6, real_log.proof(6, 10), real_log.notes[3])
        assert _timestamp(real_log.notes[3], line) == NOW
    assert json.loads(state.read_text())["logs"][ORIGIN]["time"] == NOW


# --- the command line ----------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="owngate")
    witness_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def test_cli_serve_refuses_a_missing_state_and_init_makes_one_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(uvicorn.Server, "run", lambda _server: None)  # never a real server
    state = tmp_path / "state.json"
    key = tmp_path / "witness.key"
    write_signing_key(key, "witness.example/w9")
    serve = ["witness", "serve", "--key", str(key), "--state", str(state), "--port", "1"]
    assert _cli([*serve, "--log", LOG_SIGNER.vkey]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not state.exists()
    assert _cli(["witness", "init", "--state", str(state)]) == 0
    assert json.loads(state.read_text()) == {"v": 1, "logs": {}}
    assert _cli(["witness", "init", "--state", str(state)]) == 1  # never over an existing one
    assert "already exists" in capsys.readouterr().err


# --- the spec's refusals over HTTP, races and replays -------------------------------------------


def _post(server: ServerThread, request: AddCheckpoint) -> httpx.Response:
    return httpx.post(server.url + "/add-checkpoint", content=request.encode(), timeout=10)


def test_http_fork_and_replays_are_409_with_the_known_size(
    tmp_path: Path, real_log: RealLog
) -> None:
    fork = make_log(tmp_path / "fork", tenants=("someone-else",) * 3)
    with (
        open_witness(tmp_path / "w.json") as witness,
        ServerThread(create_witness_app(witness)) as server,
    ):
        first = AddCheckpoint(0, (), real_log.notes[1])
        second = AddCheckpoint(2, tuple(real_log.proof(2, 6)), real_log.notes[2])
        assert _post(server, first).status_code == 200
        assert _post(server, second).status_code == 200
        for refused in (
            AddCheckpoint(6, (), fork.notes[2]),  # the same size, another root: a fork
            first,  # a replay of an old cosigned request
            second,  # a replay of the latest one: its old size is no longer the witness's
            AddCheckpoint(2, tuple(fork.proof(2, 6)), fork.notes[2]),
        ):
            answer = _post(server, refused)
            assert answer.status_code == 409, answer.text
            assert answer.headers["content-type"] == "text/x.tlog.size"
            assert answer.content == b"6\n"
        proof_for_another_size = tuple(real_log.proof(2, 10))  # old 6, a proof from 2
        assert (
            _post(server, AddCheckpoint(6, proof_for_another_size, real_log.notes[3])).status_code
            == 422
        )
        assert witness.latest(ORIGIN) == TreeHead(6, real_log.checkpoint(2).root)


def _split_log(directory: Path) -> RealLog:
    """`real_log`'s twin up to size 6, other records after: a fork both of whose size-10
    checkpoints are consistent with the cosigned size 6."""
    return make_log(directory, tenants=("acme-app", "acme-app", "someone-else"))


def test_two_checkpoints_racing_from_one_old_size_get_one_cosignature(
    tmp_path: Path, real_log: RealLog
) -> None:
    """Two different size-10 trees, each with a valid proof from the cosigned size 6, sent
    at once: one is cosigned, the other is refused (409), whichever comes first."""
    split = _split_log(tmp_path / "split")
    assert split.checkpoint(2).root == real_log.checkpoint(2).root
    assert split.checkpoint(3).root != real_log.checkpoint(3).root
    rivals = {"honest": real_log, "split": split}
    for round_ in range(5):  # bounded; the winner may differ between rounds
        with open_witness(tmp_path / f"w{round_}.json") as witness:
            cosign_up_to(witness, real_log, 2)  # size 6
            results = _race(witness, rivals)
            assert sorted(results.values()) == ["conflict", "cosigned"], results
            (winner,) = (name for name, result in results.items() if result == "cosigned")
            assert witness.latest(ORIGIN) == TreeHead(10, rivals[winner].checkpoint(3).root)


def _race(witness: Witness, rivals: dict[str, RealLog]) -> dict[str, str]:
    """Submit each log's size 10 from old 6 at once; what each got ("cosigned" or a code)."""
    start = threading.Barrier(len(rivals), timeout=30)
    results: dict[str, str] = {}

    def submit(name: str, log: RealLog) -> None:
        start.wait()
        try:
            witness.add_checkpoint(6, log.proof(6, 10), log.notes[3])
            results[name] = "cosigned"
        except WitnessError as error:
            results[name] = error.code

    threads = [threading.Thread(target=submit, args=item) for item in rivals.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


# --- answers and cosigned files that sign something else ----------------------------------------


def test_the_client_refuses_a_valid_cosignature_on_another_checkpoint(real_log: RealLog) -> None:
    """A network attacker replays the witness's earlier answer (a real cosignature, by the
    right key, on the previous checkpoint): the client takes nothing from it."""
    old_text = real_log.notes[1].decode().split("\n\n")[0] + "\n"
    replayed = COSIGNER.cosign(old_text, NOW).line().encode()
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(replayed), replayed)

    async def prove(old: int, new: int) -> Sequence[bytes]:
        return real_log.proof(old, new)

    async def scenario() -> None:
        server, url = await answer_once(reply)
        async with server:
            client = WitnessClient(url, COSIGNER.vkey, timeout=5, clock=lambda: NOW)
            with pytest.raises(SignatureError):
                await client.cosign(real_log.notes[2], 6, prove)
            assert client.old_size == 0  # nothing learnt from a bad answer

    asyncio.run(scenario())


def test_audit_refuses_a_cosignature_moved_to_another_checkpoint(
    witnessed_log: Path, tmp_path: Path
) -> None:
    """The witness's line from cosigned/4 appended to cosigned/8's checkpoint (a
    cosignature for another checkpoint body) fails; the same key under another name
    counts for nothing."""
    keys = [COSIGNED_LOG_SIGNER.verifier()]
    copy = copy_log(witnessed_log, tmp_path)
    four, eight = cosigned_path(copy, 4), cosigned_path(copy, 8)
    w1_line = next(
        line for line in four.read_text().splitlines() if line.startswith(f"\u2014 {W1.name} ")
    )
    note_8 = eight.read_text().split("\n\n")[0] + "\n\n"
    log_line = next(
        line
        for line in eight.read_text().splitlines()
        if line.startswith(f"\u2014 {keys[0].name} ")
    )
    eight.write_text(f"{note_8}{log_line}\n{w1_line}\n")
    with pytest.raises(LogVerificationError, match=f"cosigned/{8:020d}: invalid cosignature"):
        verify_log(copy, keys, witnesses=[W1.vkey])


def test_audit_refuses_a_cosignature_whose_time_was_rewritten(
    witnessed_log: Path, tmp_path: Path
) -> None:
    """The timestamp is signed: a line dated back a day (to pass for an older, staler
    cosignature, or to fit a story) no longer verifies."""
    copy = copy_log(witnessed_log, tmp_path)
    four = cosigned_path(copy, 4)
    text = four.read_text()
    line = next(line for line in text.splitlines() if line.startswith(f"\u2014 {W1.name} "))
    real = parse_cosignature_line(line)
    redated = Cosignature(real.name, real.key_id, real.timestamp - 86400, real.signature)
    four.write_text(text.replace(line + "\n", redated.line()))
    with pytest.raises(LogVerificationError, match=f"cosigned/{4:020d}: invalid cosignature"):
        verify_log(copy, [COSIGNED_LOG_SIGNER.verifier()], witnesses=[W1.vkey])
