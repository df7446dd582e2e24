"""A witness key under the name and key id of the log's key, or of another witness key.

A signature line names its key only by `name+hexid` (32 bits of SHA-256; a cosignature's
id hashes the type byte 0x04 where a log key's hashes 0x01, but 32 bits still collide:
a birthday search over some 95,000 seeds found both pairs below). A verifier checks
every line under a key's name and id with that key (C2SP signed-note: one that fails
rejects the note), so:

- a witness whose key twins the log's key makes the log's own signature line its
  "cosignature" (a malformed one) and its cosignature lines the log's "signatures"
  (invalid ones): `audit verify --witness-key` and `audit proof verify` of a genuine log
  it cosigned failed, and so would any standard verifier of the cosigned checkpoints;
- two witness keys that twin each other check each other's lines: a quorum of the two
  failed on a genuine cosignature by one of them.

Neither lets a cosignature pass that its key did not make (every line that counts is
verified with the key whose name and id it carries, over the witness's own message): the
harm is denial. Now such a set is refused before anything is read, naming both keys, as
two log keys under one name and id are (tests/unit/test_log_key_id_collision.py): by the
audit, by `witness serve --log`, and by the gateway's config and log open.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.api.recorder_log import open_log
from gateway.cli.main import main
from gateway.config.provenance import ProvenanceSettings
from gateway.logs import get_logger
from gateway.provenance import KeyFormatError, LogVerificationError, ProvenanceLog, verify_log
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.layout import cosigned_path, list_history
from gateway.provenance.formats.note import Signer
from gateway.provenance.testing import log_request, seeded_signer
from gateway.provenance.witness.state import WitnessState
from gateway.provenance.witness.witness import Witness
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import owngate_argv


def _seed(number: int) -> bytes:
    return hashlib.sha256(b"owngate-test-witness-collision/%d" % number).digest()


def _signer(number: int) -> Signer:
    return Signer.from_seed("gpu", _seed(number))


LOGS_KEY = _signer(58525)
TWIN = Cosigner(_signer(1662))  # a witness key under the log key's name and id
W1, W2 = Cosigner(_signer(46574)), Cosigner(_signer(94057))  # two witnesses, one name and id
HONEST = Cosigner(seeded_signer("witness.example/w1"))
NOW = 1_800_000_000.0
HANG_GUARD_S = 30  # only a witness that started serves this long: a failure, not a measure


def test_the_pairs_are_two_keys_with_one_name_and_id() -> None:
    assert LOGS_KEY.public_key != TWIN.public_key and W1.public_key != W2.public_key
    assert str(LOGS_KEY) == str(TWIN) == "gpu+236e30eb"
    assert str(W1) == str(W2) == "gpu+2f6338d7"


def _cosigned_log(directory: Path, cosigners: tuple[Cosigner, ...]) -> Path:
    """A genuine log of `gpu`, each checkpoint cosigned by `cosigners`."""

    async def write() -> None:
        opened = await ProvenanceLog.open(directory, "gpu", LOGS_KEY)
        await log_request(opened, 1)
        await opened.close()

    asyncio.run(write())
    for size, path in list_history(directory):
        note = path.read_bytes()
        text = note.partition(b"\n\n")[0].decode() + "\n"
        lines = b"".join(w.cosign(text, 1_700_000_000).line().encode() for w in cosigners)
        cosigned_path(directory, size).parent.mkdir(exist_ok=True)
        cosigned_path(directory, size).write_bytes(note + lines)
    return directory


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """Cosigned by TWIN, W1 and HONEST."""
    return _cosigned_log(tmp_path / "log", (TWIN, W1, HONEST))


def test_the_log_verifies_with_witnesses_that_twin_no_key(tmp_path: Path) -> None:
    log = _cosigned_log(tmp_path / "log", (W1, HONEST))
    for witnesses in ([W1.vkey], [HONEST.vkey], [W1.vkey, HONEST.vkey]):
        summary = verify_log(log, [LOGS_KEY.verifier()], witnesses=witnesses, now=NOW)
        assert summary.witnesses is not None and summary.witnesses.cosigned > 0


@pytest.mark.parametrize(
    ("cosigners", "witnesses", "named"),
    [
        ((TWIN, HONEST), [TWIN.vkey], (LOGS_KEY.vkey, TWIN.vkey)),
        ((TWIN, HONEST), [HONEST.vkey, TWIN.vkey], (LOGS_KEY.vkey, TWIN.vkey)),
        ((W1, HONEST), [W1.vkey, W2.vkey], (W1.vkey, W2.vkey)),
    ],
)
def test_an_ambiguous_witness_key_is_refused_before_anything_is_read(
    tmp_path: Path, cosigners: tuple[Cosigner, ...], witnesses: list[str], named: tuple[str, str]
) -> None:
    # Before: the genuine log failed ("cosigned/...: invalid signature for key
    # gpu+236e30eb"; "invalid cosignature by witness gpu+2f6338d7": W2 checked W1's line).
    log = _cosigned_log(tmp_path / "log", cosigners)
    for directory in (log, tmp_path / "absent"):  # refused before the directory is read
        with pytest.raises(KeyFormatError, match="ambiguous") as refused:
            verify_log(directory, [LOGS_KEY.verifier()], witnesses=witnesses, now=NOW)
        assert all(key in str(refused.value) for key in named), refused.value


def test_the_audit_command_refuses_it_naming_both(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["audit", "verify", str(log), "--key", LOGS_KEY.vkey, "--witness-key", TWIN.vkey]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "ambiguous" in err and LOGS_KEY.vkey in err and TWIN.vkey in err


def test_a_genuine_log_cosigned_by_a_twin_fails_no_audit_that_trusts_it_not(log: Path) -> None:
    """What the refusal leaves: an auditor who does not give the twin's key cannot be
    refused, and its lines in `cosigned/` still fail the log key's check (as they would
    in any C2SP verifier). The gateway refuses such a witness in its config, so its lines
    never reach `cosigned/` (next tests)."""
    with pytest.raises(LogVerificationError, match=r"gpu\+236e30eb"):
        verify_log(log, [LOGS_KEY.verifier()], witnesses=[HONEST.vkey], now=NOW)


def test_the_gateway_refuses_twin_witnesses_at_config_load() -> None:
    witnesses = [{"url": "http://127.0.0.1:9/w", "vkey": w.vkey} for w in (W1, W2)]
    settings = {"dir": "log", "origin": "gpu", "signing_key_file": "log.key"}
    with pytest.raises(ValidationError, match=r"gpu\+2f6338d7.*ambiguous"):
        ProvenanceSettings.model_validate({**settings, "witnesses": witnesses})


def test_the_gateway_refuses_a_witness_that_twins_its_key_at_the_logs_open(
    tmp_path: Path,
) -> None:
    (tmp_path / "log.key").write_text(LOGS_KEY.skey(_seed(58525)) + "\n")
    (tmp_path / "log.key").chmod(0o600)
    settings = ProvenanceSettings.model_validate(
        {
            "dir": "log",
            "origin": "gpu",
            "signing_key_file": "log.key",
            "witnesses": [{"url": "http://127.0.0.1:9/w", "vkey": TWIN.vkey}],
        }
    )
    with pytest.raises(KeyFormatError, match=r"gpu\+236e30eb.*ambiguous"):
        asyncio.run(open_log(settings, tmp_path, new_origin=False, events=get_logger("test")))
    assert not (tmp_path / "log").exists()  # refused before the log was opened


def test_a_witness_whose_key_twins_a_log_it_witnesses_refuses_to_start(tmp_path: Path) -> None:
    state = WitnessState.open(tmp_path / "state", new=True)
    with pytest.raises(KeyFormatError, match=r"gpu\+236e30eb.*ambiguous"):
        Witness(TWIN, [LOGS_KEY.verifier()], state)
    state.close()


def test_witness_serve_refuses_to_start_naming_both(tmp_path: Path) -> None:
    # Before: it started and served (cosigning with a key that breaks the log's audits);
    # the hang guard ends that run as a failure.
    key = tmp_path / "witness.key"
    key.write_text(_signer(1662).skey(_seed(1662)) + "\n")
    key.chmod(0o600)
    state = tmp_path / "state"
    WitnessState.open(state, new=True).close()
    argv = ["witness", "serve", "--key", str(key), "--state", str(state)]
    argv += ["--host", "127.0.0.1", "--port", "0", "--log", LOGS_KEY.vkey]
    done = subprocess.run(
        owngate_argv(*argv),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "ambiguous" in done.stderr and LOGS_KEY.vkey in done.stderr
    assert TWIN.vkey in done.stderr


def _config(directory: Path, key: Signer, seed: bytes, provenance: str) -> Path:
    """A gateway.yaml in `directory` whose log is signed by `key`, with `provenance`
    (YAML lines of its `provenance:` mapping) added."""
    (directory / "log.key").write_text(key.skey(seed) + "\n")
    (directory / "log.key").chmod(0o600)
    path = directory / "gateway.yaml"
    path.write_text(
        "backends:\n"
        "  - {id: gpu, kind: vllm, base_url: 'http://127.0.0.1:9', models: [{name: m}],\n"
        "     region: eu-west-1, owner: me,\n"
        "     retention: {days: 0, zero_data_retention: true, evidence: own}}\n"
        "tenants: [{id: acme, models: ['*']}]\n"
        "provenance:\n  dir: log\n  origin: gpu\n  signing_key_file: log.key\n" + provenance
    )
    return path


def test_config_validate_names_a_witness_that_twins_the_signing_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "ok", and `serve` of the same config refused at the log's open (exit 3);
    # so did the admin API's config/validate (the same `validate`).
    witness = f"  witnesses: [{{url: 'http://127.0.0.1:9/w', vkey: '{TWIN.vkey}'}}]\n"
    config = _config(tmp_path, LOGS_KEY, _seed(58525), witness)
    assert main(["config", "validate", str(config)]) == 1
    out = capsys.readouterr()
    assert "ambiguous" in out.out + out.err
    assert LOGS_KEY.vkey in out.out + out.err and TWIN.vkey in out.out + out.err
    honest = f"  witnesses: [{{url: 'http://127.0.0.1:9/w', vkey: '{HONEST.vkey}'}}]\n"
    assert main(["config", "validate", str(_config(tmp_path, LOGS_KEY, _seed(58525), honest))]) == 0
