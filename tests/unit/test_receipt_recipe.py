"""docs/provenance.md's independent receipt recipe (hashlib + an Ed25519 library) is run
as written against owngate's receipts, v1 and v2, and against forgeries of both."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature

from gateway.canonical import canonical_json
from gateway.provenance import Receipt, Salts, make_receipt, seal_receipts
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.testing import CountingRandom, seeded_signer
from tests.helpers.paths import REPO_ROOT

LOG = "gateway.example/log/1"
SIGNER = seeded_signer(LOG)
OTHER = seeded_signer(LOG, seed=2)  # same name, another key
SALTS = CountingRandom()


def _recipe() -> dict[str, Any]:
    text = (REPO_ROOT / "docs" / "provenance.md").read_text()
    found = re.search(r"<!-- receipt-recipe -->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, "docs/provenance.md has no receipt recipe"
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), "docs/provenance.md:recipe", "exec"), namespace)
    return namespace


def _receipt(index: int) -> Receipt:
    return Receipt(
        f"req-{index}",
        LOG,
        index,
        leaf_hash(b"%d" % index),
        "vllm-eu-1",
        "sha256:" + "ab" * 32,
        Salts(SALTS(32), SALTS(32)),
    )


def test_the_documented_recipe_verifies_both_forms() -> None:
    verify = _recipe()["verify_receipt"]
    receipts = [_receipt(n) for n in (3, 4, 6, 9, 10)]
    v2 = seal_receipts([(r.index, canonical_json(r.payload())) for r in receipts], LOG, SIGNER)
    for receipt, envelope in zip(receipts, v2, strict=True):
        assert verify(envelope, SIGNER.vkey) == receipt.payload()
    assert verify(make_receipt(receipts[0], SIGNER), SIGNER.vkey) == receipts[0].payload()


def test_the_documented_recipe_refuses_forgeries() -> None:
    verify = _recipe()["verify_receipt"]
    receipts = [_receipt(n) for n in (3, 4, 6)]
    v2 = seal_receipts([(r.index, canonical_json(r.payload())) for r in receipts], LOG, SIGNER)
    mine = json.loads(v2[0])
    altered_claims = {**receipts[0].payload(), "backend": "elsewhere"}
    forged = [
        {**mine, "payload": base64.b64encode(canonical_json(altered_claims)).decode()},
        {**mine, "path": json.loads(v2[1])["path"]},
        {**mine, "position": 1},
        {**mine, "path": mine["path"] * 6},
    ]
    for value in forged:
        with pytest.raises(AssertionError):
            verify(canonical_json(value), SIGNER.vkey)
    with pytest.raises(AssertionError, match="duplicated"):
        verify(v2[0][:-1] + b',"position":0}', SIGNER.vkey)
    with pytest.raises((AssertionError, InvalidSignature)):
        verify(v2[0], OTHER.vkey)  # another key of the same name
    # a key id that matches, a signature by another key: the signature check refuses it
    _, other_id, _ = OTHER.vkey.split("+")
    lying = f"{LOG}+{other_id}+{SIGNER.vkey.split('+')[2]}"
    with pytest.raises(InvalidSignature):
        verify(make_receipt(receipts[0], OTHER), lying)
