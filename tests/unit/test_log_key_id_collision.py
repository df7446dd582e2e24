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

from gateway.cli.main import main
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
