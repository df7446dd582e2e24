"""A receipt is JSON text as RFC 8259 has it, or it does not verify.

Python's `json.loads` reads more than JSON: `NaN`, `Infinity` and `-Infinity`, a number
past a double's range (`1e400`, as inf; 400 digits, as an exact integer), UTF-16 and
UTF-32 (told by their zero bytes or byte order mark), a UTF-8 byte order mark and
surrogates encoded in UTF-8. JavaScript's `JSON.parse` and Go's `encoding/json` refuse
them (or read `1e400` as Infinity), so an auditor's verifier in another language refused
receipts that `owngate audit receipt verify` and the docs' recipe, both on `json.loads`,
passed as `ok`, each in a member no verifier reads (a v1 envelope's extra member, a
signature's, a batch receipt's `attestation`): one receipt, two verdicts, where the
docs promise one (duplicated member names were refused for that reason already).

`_independent_verdict` is a verifier written from docs/provenance.md's prose alone, with
no owngate import and not the recipe's code, reading JSON as RFC 8259 has it; it must
agree with owngate and with the recipe on honest receipts, on what a holder can reshape
of one (members, signatures, path, position) and on hostile encodings.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.canonical import canonical_json
from gateway.cli.main import main
from gateway.provenance import (
    ProvenanceError,
    Receipt,
    Salts,
    make_receipt,
    seal_receipts,
    verify_receipt,
)
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.testing import CountingRandom, seeded_signer
from tests.helpers.paths import REPO_ROOT

LOG = "gw.test/json-text"
SIGNER = seeded_signer(LOG)
SALTS = CountingRandom("json-text")


def _receipts() -> dict[str, bytes]:
    made = [
        Receipt(f"req-{n}", LOG, n, leaf_hash(b"%d" % n), "gpu", "sha256:" + "ab" * 32, salts)
        for n, salts in ((n, Salts(SALTS(32), SALTS(32))) for n in (3, 4, 6))
    ]
    v2 = seal_receipts([(r.index, canonical_json(r.payload())) for r in made], LOG, SIGNER)
    return {"v1": make_receipt(made[0], SIGNER), "v2": v2[1]}


def _hostile(envelope: bytes) -> dict[str, bytes]:
    """What a receipt's holder can make of it that is not JSON text (RFC 8259), each in a
    member no verifier reads."""
    text = envelope.decode()
    unread = "attestation" if '"batch"' in text else "x"  # a v2 receipt's only extra member
    return {
        "NaN": text[:-1].encode() + b',"%s":NaN}' % unread.encode(),
        "-Infinity in a signature": text.replace('"sig":', '"x":-Infinity,"sig":').encode(),
        "1e400": text[:-1].encode() + b',"%s":1e400}' % unread.encode(),
        "400 digits": text[:-1].encode() + b',"%s":1%s}' % (unread.encode(), b"0" * 400),
        "UTF-8 byte order mark": b"\xef\xbb\xbf" + envelope,
        "UTF-16": text.encode("utf-16"),
        "UTF-16LE": text.encode("utf-16-le"),
        "UTF-32": text.encode("utf-32"),
        "a surrogate encoded in UTF-8": text[:-1].encode()
        + b',"%s":"\xed\xa0\x80"}' % unread.encode(),
    }


def _rfc8259(data: bytes) -> Any:
    """JSON text: UTF-8, numbers a double holds, no constants, no name twice."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        assert len({name for name, _ in pairs}) == len(pairs), "a member name twice"
        return dict(pairs)

    def number(text: str) -> Any:
        assert math.isfinite(float(text)), "past a double"
        return int(text) if re.fullmatch(r"-?\d+", text) else float(text)

    def constant(name: str) -> Any:
        raise ValueError(name)

    return json.loads(
        data.decode("utf-8"),
        object_pairs_hook=unique,
        parse_constant=constant,
        parse_int=number,
        parse_float=number,
    )


def _canonical_b64(text: Any) -> bytes:
    assert isinstance(text, str)
    raw = base64.b64decode(text, validate=True)
    assert base64.b64encode(raw).decode() == text
    return raw


def _signed(envelope: dict[str, Any], kind: str, vkey: str) -> bytes:
    """DSSE (docs: "Receipts"): the signatures naming the key's `name+hexid` all verify."""
    name, hexid, key = vkey.split("+", 2)
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(key)[1:])
    assert envelope["payloadType"] == kind
    payload = _canonical_b64(envelope["payload"])
    kind_bytes = kind.encode()
    pae = b"DSSEv1 %d %s %d %s" % (len(kind_bytes), kind_bytes, len(payload), payload)
    signatures = envelope["signatures"]
    assert isinstance(signatures, list) and 1 <= len(signatures) <= 8
    assert all(isinstance(s, dict) for s in signatures)
    mine = [s for s in signatures if s.get("keyid") == f"{name}+{hexid}"]
    assert mine
    for signature in mine:
        public.verify(_canonical_b64(signature["sig"]), pae)
    return payload


def _independent_verdict(data: bytes, vkey: str) -> Any:
    """The receipt's claims, or None where it does not verify (docs: both forms)."""
    kind = "application/vnd.owngate.receipt+json"
    try:
        assert len(data) <= 64 * 1024
        receipt = _rfc8259(data)
        if "batch" not in receipt:
            return _rfc8259(_signed(receipt, kind, vkey))
        members = {"batch", "path", "payload", "payloadType", "position"}
        assert set(receipt) - {"attestation"} == members
        assert set(receipt["batch"]) == {"payload", "payloadType", "signatures"}
        assert receipt["payloadType"] == kind
        statement = _rfc8259(
            _signed(receipt["batch"], "application/vnd.owngate.receipt-batch+json", vkey)
        )
        payload = _canonical_b64(receipt["payload"])
        claims = _rfc8259(payload)
        assert claims["log"] == statement["log"]
        assert statement["first"] <= claims["index"] < statement["first"] + statement["entries"]
        node = hashlib.sha256(b"\0" + payload).digest()
        at, last = receipt["position"], statement["receipts"] - 1
        assert type(at) is int and 0 <= at <= last
        assert type(receipt["path"]) is list and len(receipt["path"]) <= 10
        for sibling in map(_canonical_b64, receipt["path"]):  # RFC 9162, 2.1.3.2
            assert len(sibling) == 32 and last > 0
            if at & 1 or at == last:
                node = hashlib.sha256(b"\1" + sibling + node).digest()
                while not at & 1 and at:
                    at, last = at >> 1, last >> 1
            else:
                node = hashlib.sha256(b"\1" + node + sibling).digest()
            at, last = at >> 1, last >> 1
        assert last == 0 and node.hex() == statement["root"]
        return claims
    except Exception:  # noqa: BLE001 - any exception is this verifier's "refused"
        return None


def _owngate_verdict(data: bytes) -> Any:
    try:
        return verify_receipt(data, [SIGNER.verifier()]).payload()
    except ProvenanceError:
        return None


def _recipe_verdict(data: bytes) -> Any:
    text = (REPO_ROOT / "docs" / "provenance.md").read_text()
    found = re.search(r"<!-- receipt-recipe -->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, "docs/provenance.md has no receipt recipe"
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), "docs/provenance.md:recipe", "exec"), namespace)
    try:
        return namespace["verify_receipt"](data, SIGNER.vkey)
    except Exception:  # noqa: BLE001 - any exception is the recipe's "refused"
        return None


@pytest.mark.parametrize("form", ["v1", "v2"])
def test_an_honest_receipt_gets_one_verdict_from_every_verifier(form: str) -> None:
    envelope = _receipts()[form]
    claims = _owngate_verdict(envelope)
    assert claims is not None
    assert _independent_verdict(envelope, SIGNER.vkey) == claims
    assert _recipe_verdict(envelope) == claims
    # re-encoded (pretty-printed, in ASCII escapes): still JSON text, still the receipt's
    pretty = json.dumps(json.loads(envelope), indent=2).encode()
    assert _owngate_verdict(pretty) == _independent_verdict(pretty, SIGNER.vkey) == claims


@pytest.mark.parametrize("form", ["v1", "v2"])
def test_a_receipt_that_is_not_json_text_is_refused_by_every_verifier(form: str) -> None:
    """Before, owngate and the recipe passed every one of these as the log's receipt."""
    passed = {
        name: (_owngate_verdict(data) is not None, _recipe_verdict(data) is not None)
        for name, data in _hostile(_receipts()[form]).items()
    }
    for name, data in _hostile(_receipts()[form]).items():
        assert _independent_verdict(data, SIGNER.vkey) is None, name
    assert {name: verdicts for name, verdicts in passed.items() if any(verdicts)} == {}


def _reshaped(envelope: bytes) -> dict[str, bytes]:
    """What a receipt's holder can make of it that is still JSON text: each verifier
    refuses the same ones (docs: "Receipts")."""
    value = json.loads(envelope)
    signed = value.get("batch", value)
    good = signed["signatures"][0]

    def signing(**members: Any) -> dict[str, Any]:
        return (
            {**value, "batch": {**signed, **members}} if "batch" in value else {**signed, **members}
        )

    found: dict[str, Any] = {
        "as is": value,
        "a member more": {**value, "x": 1},
        "a signature more, of another key": signing(signatures=[good, {"keyid": "o+0", "sig": ""}]),
        "a bad signature of the key": signing(signatures=[good, {**good, "sig": "A" * 86 + "=="}]),
        "nine signatures": signing(signatures=[good] * 9),
        "the envelope with a member more": signing(x=1),
    }
    if "batch" in value:
        found |= {
            "path a string": {**value, "path": ""},
            "path an object": {**value, "path": {}},
            "position a float": {**value, "position": float(value["position"])},
            "position past the batch": {**value, "position": 3},
            "another position": {**value, "position": value["position"] ^ 1},
        }
    return {name: json.dumps(v, indent=1).encode() for name, v in found.items()}


@pytest.mark.parametrize("form", ["v1", "v2"])
def test_a_reshaped_receipt_gets_one_verdict_from_every_verifier(form: str) -> None:
    verdicts = {
        name: (
            _owngate_verdict(data),
            _independent_verdict(data, SIGNER.vkey),
            _recipe_verdict(data),
        )
        for name, data in _reshaped(_receipts()[form]).items()
    }
    assert verdicts["as is"][0] is not None
    assert {name: v for name, v in verdicts.items() if not v[0] == v[1] == v[2]} == {}


def test_audit_receipt_verify_fails_a_receipt_that_is_not_json_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "receipt.json"
    path.write_bytes(_hostile(_receipts()["v1"])["NaN"])
    assert main(["audit", "receipt", "verify", str(path), "--key", SIGNER.vkey]) == 1
    said = capsys.readouterr()
    assert "ok:" not in said.out and "receipt is not JSON: NaN" in said.err
