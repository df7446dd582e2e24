"""Two trusted log keys with one name and key id. A signature line (and a receipt's DSSE
`keyid`) names its key only by `name+hexid`, 32 bits of SHA-256, so whoever makes the
second key of a rotation (or hands an auditor a key to add) can give it the id of the
log's key: a birthday search over some 65,000 keys, 11 s on this project's machine. Given
both, `audit verify` and `audit receipt verify` checked each line with whichever of the
two came last, so the verdict on a genuine log depended on the order of `--key` flags
(`--key A --key B`: "invalid signature", `--key B --key A`: ok). Go's `sumdb/note` calls
such a set ambiguous and refuses it; so does owngate now, naming the two keys, before
anything is read. The pair is the one of tests/unit/test_attest_key_id_collision.py."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.api.recorder_log import open_log
from gateway.cli.main import main
from gateway.config.provenance import ProvenanceSettings
from gateway.logs import get_logger
from gateway.provenance import KeyFormatError, ProvenanceLog, load_verifiers
from gateway.provenance.formats.note import Signer
from gateway.provenance.formats.receipts import make_receipt
from gateway.provenance.testing import log_request


def _signer(number: int) -> Signer:
    return Signer.from_seed("gpu", hashlib.sha256(b"owngate-test-collision/%d" % number).digest())


LOGS_KEY, TWIN = _signer(58093), _signer(63524)


def test_the_pair_is_two_keys_with_one_name_and_id() -> None:
    assert LOGS_KEY.vkey != TWIN.vkey
    assert str(LOGS_KEY) == str(TWIN) == "gpu+63b2a5ae"


def test_a_trusted_set_with_two_keys_under_one_name_and_id_is_refused() -> None:
    with pytest.raises(KeyFormatError, match=r"gpu\+63b2a5ae.*ambiguous"):
        load_verifiers([LOGS_KEY.vkey, TWIN.vkey])
    assert len(load_verifiers([LOGS_KEY.vkey, LOGS_KEY.vkey])) == 2  # one key twice: fine


@pytest.mark.parametrize("order", ["log's key first", "log's key last"])
def test_the_audit_refuses_the_pair_whatever_their_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], order: str
) -> None:
    async def write() -> bytes:
        log = await ProvenanceLog.open(tmp_path / "log", "gpu", LOGS_KEY)
        logged = await log_request(log, 1)
        await log.close()
        return make_receipt(logged.receipt, LOGS_KEY)

    receipt = tmp_path / "receipt.json"
    receipt.write_bytes(asyncio.run(write()))
    pair = [LOGS_KEY.vkey, TWIN.vkey]
    keys = pair if order == "log's key first" else pair[::-1]
    flags = [word for key in keys for word in ("--key", key)]
    assert main(["audit", "verify", str(tmp_path / "log"), "--key", LOGS_KEY.vkey]) == 0
    for command in (
        ["audit", "verify", str(tmp_path / "log"), *flags],
        ["audit", "receipt", "verify", str(receipt), *flags],
        ["audit", "receipt", "verify", str(receipt), *flags, "--log", str(tmp_path / "log")],
    ):
        capsys.readouterr()
        assert main(command) != 0, command
        shown = capsys.readouterr()
        assert "ambiguous" in shown.out + shown.err


def test_the_gateways_retired_keys_are_refused_at_config_load_when_two_are_twins() -> None:
    # Before: taken as they came; the admin receipt check and the log's open then checked
    # a line with whichever of the two they met, as the audit did before it refused.
    with pytest.raises(ValidationError, match=r"gpu\+63b2a5ae.*ambiguous"):
        ProvenanceSettings(
            dir="log",
            origin="gpu",
            signing_key_file="log.key",
            retired_verifier_keys=(LOGS_KEY.vkey, TWIN.vkey),
        )
    same = (LOGS_KEY.vkey, LOGS_KEY.vkey)  # one key twice: fine
    assert (
        ProvenanceSettings(
            dir="log", origin="gpu", signing_key_file="log.key", retired_verifier_keys=same
        ).retired_verifier_keys
        == same
    )


def test_a_retired_key_that_twins_the_signing_key_is_refused_at_the_logs_open(
    tmp_path: Path,
) -> None:
    seed = hashlib.sha256(b"owngate-test-collision/58093").digest()  # LOGS_KEY's
    (tmp_path / "log.key").write_text(LOGS_KEY.skey(seed) + "\n")
    (tmp_path / "log.key").chmod(0o600)
    settings = ProvenanceSettings(
        dir="log", origin="gpu", signing_key_file="log.key", retired_verifier_keys=(TWIN.vkey,)
    )
    with pytest.raises(KeyFormatError, match=r"gpu\+63b2a5ae.*ambiguous"):
        asyncio.run(open_log(settings, tmp_path, new_origin=False, events=get_logger("test")))
    assert not (tmp_path / "log").exists()  # refused before the log was opened


def test_config_validate_names_a_retired_key_that_twins_the_signing_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "ok", and `serve` of the same config refused at the log's open (exit 3).
    seed = hashlib.sha256(b"owngate-test-collision/58093").digest()  # LOGS_KEY's
    (tmp_path / "log.key").write_text(LOGS_KEY.skey(seed) + "\n")
    (tmp_path / "log.key").chmod(0o600)
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "backends:\n"
        "  - {id: gpu, kind: vllm, base_url: 'http://127.0.0.1:9', models: [{name: m}],\n"
        "     region: eu-west-1, owner: me,\n"
        "     retention: {days: 0, zero_data_retention: true, evidence: own}}\n"
        "tenants: [{id: acme, models: ['*']}]\n"
        "provenance: {dir: log, origin: gpu, signing_key_file: log.key,\n"
        f"             retired_verifier_keys: ['{TWIN.vkey}']}}\n"
    )
    assert main(["config", "validate", str(config)]) == 1
    out = capsys.readouterr()
    assert "ambiguous" in out.out + out.err
    assert LOGS_KEY.vkey in out.out + out.err and TWIN.vkey in out.out + out.err
