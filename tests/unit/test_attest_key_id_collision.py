"""Two sidecar keys with one key id: a statement names its key by `name+hexid`, and the
hex id is only 32 bits of SHA-256, so a key holder can make a second key with the id of
another (a birthday search over some 65,000 keys for a pair; a targeted one costs 2**32).
The pair below was found that way (seeds `SHA-256("owngate-test-collision/N")`, N =
58093 and 63524, name `gpu`: id `gpu+63b2a5ae`). Two backends given such keys are refused
as if they had one key, by config validation and by the audit: neither may take one
sidecar's statement for the other's, nor mix their counters."""

from __future__ import annotations

import hashlib

import pytest
import yaml

from gateway.config import ConfigError, parse_config
from gateway.provenance import Verifier, generate_signing_key
from gateway.provenance.formats.attestation import one_key_per_backend
from tests.helpers.gateways import backend


def _vkey(number: int) -> str:
    seed = hashlib.sha256(b"owngate-test-collision/%d" % number).digest()
    return generate_signing_key("gpu", random=lambda _: seed)[1]


FIRST, SECOND = _vkey(58093), _vkey(63524)


def test_the_pair_is_two_keys_with_one_id() -> None:
    assert FIRST != SECOND
    assert FIRST.split("+")[:2] == SECOND.split("+")[:2] == ["gpu", "63b2a5ae"]


def test_config_refuses_two_attested_backends_whose_keys_share_an_id() -> None:
    two = [
        backend("gpu-a", "http://10.0.0.1:8101", "m", attest={"key": FIRST}),
        backend("gpu-b", "http://10.0.0.2:8101", "m", attest={"key": SECOND}),
    ]
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_dump({"backends": two}))
    (said,) = [str(issue) for issue in caught.value.issues if "gpu+63b2a5ae" in str(issue)]
    # Two different keys: the message says their ids collide (not "one attest.key", which
    # sends the operator looking for a copied key), naming both backends.
    assert "'gpu-a' and 'gpu-b'" in said
    assert "different keys with one key id (gpu+63b2a5ae)" in said
    assert "one attest.key" not in said


def test_the_audit_refuses_them_too() -> None:
    with pytest.raises(
        ValueError, match=r"gpu-a and gpu-b are given different keys with one key id"
    ):
        one_key_per_backend({"gpu-a": Verifier(FIRST), "gpu-b": Verifier(SECOND)})
