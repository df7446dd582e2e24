"""docs/provenance.md's independent receipt recipe (hashlib + an Ed25519 library) is run
as written against owngate's receipts, v1 and v2, and against forgeries of both."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature

from gateway.canonical import canonical_json
from gateway.provenance import (
    ProvenanceError,
    Receipt,
    Salts,
    commit,
    make_receipt,
    seal_receipts,
    verify_receipt,
)
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.receipt_batch import MAX_BATCH_RECEIPTS
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
    # a verifier key naming another key's id: refused before any signature is read
    _, other_id, _ = OTHER.vkey.split("+", 2)
    lying = f"{LOG}+{other_id}+{SIGNER.vkey.split('+', 2)[2]}"
    with pytest.raises(AssertionError, match="key id"):
        verify(make_receipt(receipts[0], OTHER), lying)


def _code_verdict(data: bytes) -> dict[str, object] | None:
    try:
        return verify_receipt(data, [SIGNER.verifier()]).payload()
    except ProvenanceError:
        return None


def _recipe_verdict(verify: Any, data: bytes) -> dict[str, object] | None:
    try:
        claims: dict[str, object] = verify(data, SIGNER.vkey)
    except Exception:  # noqa: BLE001 - any exception is the recipe's "refused"
        return None
    return claims


def _variants(envelope: bytes) -> dict[str, dict[str, Any]]:
    """What anyone holding `envelope` can make of it without the log's key."""
    value = json.loads(envelope)
    batched = "batch" in value
    signed = value["batch"] if batched else value
    good = signed["signatures"][0]
    bad = {**good, "sig": base64.b64encode(bytes(64)).decode()}

    def signatures(items: object, **extra: object) -> dict[str, Any]:
        envelope = {**signed, "signatures": items, **extra}
        return {**value, "batch": envelope} if batched else envelope

    found = {
        "as is": value,
        "a member more": {**value, "extra": 1},
        "a countersignature past the size cap": {**value, "attestation": "x" * 70_000},
        "good, then a bad one of the same key": signatures([good, bad]),
        "bad, then good": signatures([bad, good]),
        "no key id": signatures([{"sig": good["sig"]}]),
        "no key id, then good": signatures([{"sig": good["sig"]}, good]),
        "unknown key id": signatures([{**good, "keyid": "other+00000000"}]),
        "key id not a string": signatures([{**good, "keyid": 5}]),
        "nine signatures": signatures([good] * 9),
        "eight signatures": signatures([good] * 8),
        "another's sig not canonical base64": signatures([good, {"keyid": "x", "sig": "AB=="}]),
        "a signature not an object": signatures([good, 5]),
        "a signature with a member more": signatures([{**good, "extra": 1}]),
        "signatures an object": signatures({"0": good}),
        "no signatures": signatures([]),
    }
    if batched:
        found["envelope with a member more"] = signatures([good], extra=1)
        found["signatures beside the batch"] = {**value, "signatures": [good]}
        if value["position"] <= 1:
            found["position a boolean"] = {**value, "position": bool(value["position"])}
        found["position a float"] = {**value, "position": float(value["position"])}
        if not value["path"]:
            found["path a string"] = {**value, "path": ""}
            found["path an object"] = {**value, "path": {}}
    return found


def test_the_recipe_and_verify_receipt_agree_on_every_variant() -> None:
    """An auditor following the recipe gets owngate's verdict (and claims) for a receipt
    and for whatever its holder can make of it: members added, signatures added, dropped
    or reordered, types changed, in v1, in v2, and in a batch part of one receipt."""
    verify = _recipe()["verify_receipt"]
    receipts = [_receipt(n) for n in range(MAX_BATCH_RECEIPTS + 1)]
    v2 = seal_receipts([(r.index, canonical_json(r.payload())) for r in receipts], LOG, SIGNER)
    forms = {
        "v1": make_receipt(receipts[0], SIGNER),
        "v2 at 0": v2[0],
        "v2 at 1": v2[1],
        "v2 at 5": v2[5],
        "v2 alone in its part": v2[-1],
    }
    differ = []
    for form, envelope in forms.items():
        for name, value in _variants(envelope).items():
            data = json.dumps(value).encode()
            code, recipe = _code_verdict(data), _recipe_verdict(verify, data)
            if code != recipe:
                differ.append(f"{form}, {name}: owngate {code}, recipe {recipe}")
    assert not differ, "\n".join(differ)


def _signer_whose_key_has_a_plus() -> Any:
    """A log key whose verifier key's base64 holds a "+" (about half of all keys do)."""
    for seed in range(1, 65):  # bounded: each seed misses with probability ~1/2
        signer = seeded_signer(LOG, seed=seed)
        if "+" in signer.vkey.split("+", 2)[2]:
            return signer
    raise AssertionError("no seed in 1..64 gives a key with a '+' in its base64")


def test_the_documented_recipe_reads_a_verifier_key_whose_base64_has_a_plus() -> None:
    """`name+hexid+base64`: the base64 part may itself contain "+", so the key splits
    on the first two only (as Go's sumdb/note does); a plain split refused such keys."""
    signer = _signer_whose_key_has_a_plus()
    verify = _recipe()["verify_receipt"]
    receipts = [_receipt(n) for n in (3, 4)]
    v2 = seal_receipts([(r.index, canonical_json(r.payload())) for r in receipts], LOG, signer)
    assert verify(v2[0], signer.vkey) == receipts[0].payload()
    assert verify(make_receipt(receipts[1], signer), signer.vkey) == receipts[1].payload()


def test_the_documented_recipe_refuses_a_verifier_key_whose_id_is_not_its_own() -> None:
    name, _, key = SIGNER.vkey.split("+", 2)
    with pytest.raises(AssertionError, match="key id"):
        _recipe()["verify_receipt"](make_receipt(_receipt(3), SIGNER), f"{name}+00000000+{key}")


def test_the_documented_commitment_formula_is_owngates() -> None:
    """docs/provenance.md, "Commitments, not content": raw salt bytes (hex-decoded from
    the receipt), the body's raw digest, the domain with its NUL byte; hex out."""
    salts = {"request": SALTS(32).hex(), "response": SALTS(32).hex()}
    body = b'{"choices":[]}'
    for kind in ("request", "response"):
        documented = hashlib.sha256(
            f"owngate/provenance/v1/{kind}-commitment\0".encode()
            + bytes.fromhex(salts[kind])
            + hashlib.sha256(body).digest()
        ).hexdigest()
        assert documented == commit(kind, bytes.fromhex(salts[kind]), body)
