"""Unit tests: Merkle proofs (properties), commitments, records, receipts, keys, tiles."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from gateway.canonical import canonical_json
from gateway.policy.schema import DataClassName
from gateway.provenance import (
    Checkpoint,
    CommitmentMismatchError,
    KeyFormatError,
    MalformedError,
    ProofError,
    Receipt,
    RecordError,
    Salts,
    SignatureError,
    Verifier,
    commit,
    commit_digest,
    make_receipt,
    parse_record,
    verify_commitment,
    verify_receipt,
)
from gateway.provenance.formats.merkle import (
    EMPTY_ROOT,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_from_leaves,
    verify_consistency,
    verify_inclusion,
)
from gateway.provenance.formats.receipts import MAX_SIGNATURES
from gateway.provenance.formats.records import (
    DataClass,
    LogEntry,
    TraceStep,
    admin_record,
    completion_record,
    dispatch_record,
    refusal_record,
)
from gateway.provenance.formats.schema import DATA_CLASS_NAME
from gateway.provenance.formats.tiles import index_path, tile_path, tile_widths
from gateway.provenance.formats.tree import TiledTree
from gateway.provenance.testing import (
    EXAMPLE_BACKEND,
    EXAMPLE_POLICY,
    CountingRandom,
    seeded_signer,
)

LEAVES = [leaf_hash(b"entry %d" % i) for i in range(300)]


def _reader(leaves: list[bytes]):  # type: ignore[no-untyped-def]
    def read(height: int, index: int) -> bytes:
        span = 1 << height
        return root_from_leaves(leaves[index * span : (index + 1) * span])

    return read


def _reference_root(leaves: list[bytes]) -> bytes:
    """RFC 6962 MTH written as the recursive definition."""
    if not leaves:
        return EMPTY_ROOT
    if len(leaves) == 1:
        return leaves[0]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return node_hash(_reference_root(leaves[:k]), _reference_root(leaves[k:]))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_inclusion_proofs_verify_and_a_flipped_bit_fails(case: tuple[int, int]) -> None:
    size, index = case
    leaves = LEAVES[:size]
    root = _reference_root(leaves)
    assert root_from_leaves(leaves) == root
    proof = inclusion_proof(index, size, _reader(leaves))
    verify_inclusion(leaves[index], index, size, proof, root)
    if proof:
        bad = [bytearray(p) for p in proof]
        bad[-1][0] ^= 1
        with pytest.raises(ProofError):
            verify_inclusion(leaves[index], index, size, [bytes(p) for p in bad], root)
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(b"other"), index, size, proof, root)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.integers(1, n), st.just(n))))
def test_consistency_proofs_verify(case: tuple[int, int]) -> None:
    size1, size2 = case
    proof = consistency_proof(size1, size2, _reader(LEAVES[:size2]))
    root1, root2 = _reference_root(LEAVES[:size1]), _reference_root(LEAVES[:size2])
    verify_consistency(size1, size2, proof, root1, root2)
    if size1 < size2:
        with pytest.raises(ProofError):
            verify_consistency(size1, size2, proof, root2, root1)


def test_tiled_tree_matches_reference_and_names_tiles() -> None:
    tree = TiledTree()
    done = []
    for i in range(600):
        done += tree.append(b"entry %d" % i, LEAVES[i % 300] if i < 300 else leaf_hash(b"x%d" % i))
    assert [name for name, _ in done] == [
        "tile/entries/000",
        "tile/0/000",
        "tile/entries/001",
        "tile/0/001",
    ]
    assert [name for name, _ in tree.partial_files()] == [
        "tile/0/002.p/88",
        "tile/1/000.p/2",
        "tile/entries/002.p/88",
    ]
    assert list(tile_widths(70_000)) == [(0, 273, 112), (1, 1, 17), (2, 0, 1)]
    assert index_path(1234067) == "x001/x234/067"
    assert tile_path(3, 0, 7) == "tile/3/000.p/7"


def test_commitments_are_domain_separated_and_salted() -> None:
    salts = Salts.generate(CountingRandom())
    body = b"hello"
    request = commit("request", salts.request, body)
    assert request != commit("response", salts.request, body)
    assert request != commit("request", salts.response, body)
    assert commit_digest("request", salts.request, hashlib.sha256(body).digest()) == request
    verify_commitment("request", request, salts.request, body)
    with pytest.raises(CommitmentMismatchError, match="do not open"):
        verify_commitment("response", request, salts.request, body)
    assert "redacted" in repr(salts) and salts.request.hex() not in repr(salts)


def test_a_requests_two_salts_come_from_one_read_of_the_random_source() -> None:
    reads: list[int] = []

    def random(size: int) -> bytes:
        reads.append(size)
        return bytes(range(size))

    salts = Salts.generate(random)
    assert reads == [64]  # one system call per request on the hot path, not two
    assert (salts.request, salts.response) == (bytes(range(32)), bytes(range(32, 64)))


def test_records_reject_unknown_fields_and_bad_types() -> None:
    good = {
        "v": 1,
        "type": "refusal",
        "request_id": "r",
        "time": "2026-01-01T00:00:00.000Z",
        "tenant": "t",
        "model": "m",
        "policy": {"id": EXAMPLE_POLICY.id, "version": "1", "digest": "d"},
        "trace": [],
        "rule": "x",
        "reason": "y",
        "request_commitment": None,
    }
    assert parse_record(canonical_json(good)).type == "refusal"
    changes: list[tuple[dict[str, object], str]] = [
        ({"content": "the prompt"}, "unknown field 'content'"),
        ({"time": "2026-01-01 00:00"}, "field 'time'"),
        ({"v": 2}, "field 'v'"),
        ({"request_commitment": "AB" * 32}, "field 'request_commitment'"),
        ({"trace": [{"backend": "b", "verdict": "maybe", "rule": "r"}]}, "field 'trace'"),
    ]
    for change, message in changes:
        with pytest.raises(RecordError, match=message):
            parse_record(canonical_json({**good, **change}))
    with pytest.raises(RecordError, match="missing field 'reason'"):
        parse_record(canonical_json({k: v for k, v in good.items() if k != "reason"}))
    with pytest.raises(RecordError, match="not JSON"):
        parse_record(b"\xff")


_BUILDERS: dict[str, Any] = {
    "dispatch": dispatch_record,
    "refusal": refusal_record,
    "completion": completion_record,
    "admin": admin_record,
}


@pytest.mark.parametrize("kind", ["dispatch", "refusal", "completion", "admin"])
def test_a_records_blind_is_optional_and_64_lowercase_hex(kind: str) -> None:
    """`blind` (32 random bytes no receipt gives) is read in records with and without it
    (a log written before it existed still verifies); anything but 64 lowercase hex digits
    (base64 of the bytes, upper case, another length, a number, null, a list) is an
    invalid record, its value never quoted, and the builder refuses it too."""
    made = _BUILDERS[kind](**_BLINDED[kind], blind="0f" * 32)
    assert parse_record(canonical_json(made)).data["blind"] == "0f" * 32
    without = {k: v for k, v in made.items() if k != "blind"}
    assert "blind" not in parse_record(canonical_json(without)).data
    spelled = base64.b64encode(bytes(32)).decode()
    for bad in [spelled, "0F" * 32, "0f" * 31, "0f" * 33, "0f" * 32 + "\n", 5, None, ["0f" * 32]]:
        with pytest.raises(RecordError, match="field 'blind' has an invalid value") as refused:
            parse_record(canonical_json({**made, "blind": bad}))
        assert str(bad) not in str(refused.value)
        if isinstance(bad, str):
            with pytest.raises(RecordError, match="blind"):
                _BUILDERS[kind](**_BLINDED[kind], blind=bad)


@pytest.mark.parametrize("kind", ["dispatch", "refusal"])
def test_a_records_data_class_is_a_policys_class_name_null_or_absent(kind: str) -> None:
    """`data_class`: a policy's class name, null (none applied) or absent (a record
    written before it existed); a label's text (upper case, spaces, control characters,
    over 63 characters, a number) is an invalid record, and no `DataClass` is made of it."""
    for name in ("phi", "a", "x" * 63, "eu-health_2", None):
        made = _BUILDERS[kind](**_BLINDED[kind], data_class=DataClass(name))
        assert parse_record(canonical_json(made)).data["data_class"] == name
    assert "data_class" not in _BUILDERS[kind](**_BLINDED[kind])
    made = _BUILDERS[kind](**_BLINDED[kind], data_class=DataClass("phi"))
    for bad in ["PHI", " phi", "phi\n", "\x1bphi", "x" * 64, "-phi", "", "ph.i", 5, ["phi"]]:
        with pytest.raises(RecordError, match="field 'data_class' has an invalid value") as no:
            parse_record(canonical_json({**made, "data_class": bad}))
        assert not bad or repr(bad) not in str(no.value)
        with pytest.raises(RecordError, match="data_class") as no:
            DataClass(bad)  # type: ignore[arg-type]
        assert not bad or repr(bad) not in str(no.value)
    with pytest.raises(RecordError, match="data_class must be a DataClass"):
        _BUILDERS[kind](**_BLINDED[kind], data_class="phi")


def test_a_records_class_names_are_the_policys() -> None:
    """The record schema takes a class name exactly when a policy may define it."""
    policy_names = TypeAdapter(DataClassName)
    samples = ["phi", "a", "0", "x" * 63, "x" * 64, "eu_health-2", "-x", "_x", "Phi", "p.h"]
    for name in [*samples, "", "ph i", "phi\n", "\u0440hi", "phi/x"]:
        try:
            policy_names.validate_python(name)
        except ValidationError:
            assert DATA_CLASS_NAME.match(name) is None, name
        else:
            assert DATA_CLASS_NAME.match(name) is not None, name


_BLINDED: dict[str, dict[str, Any]] = {
    "dispatch": {
        "request_id": "req_0123456789abcdef01234567",
        "time": datetime(2026, 1, 1, tzinfo=UTC),
        "tenant": "t",
        "model": "m",
        "policy": EXAMPLE_POLICY,
        "trace": [TraceStep(EXAMPLE_BACKEND.id, "admitted", "r")],
        "backend": EXAMPLE_BACKEND,
        "fallback_reason": None,
        "request_commitment": "ab" * 32,
    },
    "refusal": {
        "request_id": "req_0123456789abcdef01234567",
        "time": datetime(2026, 1, 1, tzinfo=UTC),
        "tenant": "t",
        "model": "m",
        "policy": EXAMPLE_POLICY,
        "trace": [],
        "rule": "x",
        "reason": "y",
        "request_commitment": None,
    },
    "completion": {
        "request_id": "req_0123456789abcdef01234567",
        "time": datetime(2026, 1, 1, tzinfo=UTC),
        "dispatch": LogEntry(3, leaf_hash(b"dispatch")),
        "status": 502,
        "error": "upstream_error",
        "usage": None,
        "latency_ms": 31,
        "response_commitment": None,
    },
    "admin": {
        "request_id": "adm_0123456789abcdef01234567",
        "time": datetime(2026, 1, 1, tzinfo=UTC),
        "role": "security",
        "token": "0123456789ab",
        "action": "key_revoke",
        "subject": "acme",
        "change_digest": "cd" * 32,
        "outcome": "done",
    },
}


def _receipt() -> Receipt:
    return Receipt(
        request_id="req-1",
        log="gateway.example/log",
        index=4,
        dispatch_hash=leaf_hash(b"x"),
        backend="vllm-eu-1",
        policy_digest="sha256:ab",
        salts=Salts.generate(CountingRandom()),
    )


def test_receipt_is_dsse_and_verifies() -> None:
    signer = seeded_signer("gateway.example/log")
    envelope = make_receipt(_receipt(), signer)
    value = json.loads(envelope)
    assert value["payloadType"] == "application/vnd.owngate.receipt+json"
    payload = base64.b64decode(value["payload"])
    pae = b"DSSEv1 36 application/vnd.owngate.receipt+json %d " % len(payload) + payload
    signer.verifier().verify(pae, base64.b64decode(value["signatures"][0]["sig"]))
    assert verify_receipt(envelope, [signer.verifier()]) == _receipt()


def test_receipt_tampering_is_detected() -> None:
    signer = seeded_signer("gateway.example/log")
    value = json.loads(make_receipt(_receipt(), signer))
    payload = json.loads(base64.b64decode(value["payload"]))
    payload["backend"] = "openai-us"
    value["payload"] = base64.b64encode(canonical_json(payload)).decode()
    with pytest.raises(SignatureError, match="invalid signature"):
        verify_receipt(json.dumps(value).encode(), [signer.verifier()])
    del value["signatures"][0]["keyid"]
    with pytest.raises(SignatureError, match="not signed by a trusted key"):
        verify_receipt(json.dumps(value).encode(), [signer.verifier()])
    with pytest.raises(MalformedError):
        verify_receipt(b"{}", [signer.verifier()])


def test_a_receipt_with_a_flood_of_signatures_is_malformed() -> None:
    """Signatures naming no trusted key are not read, but a receipt with hundreds of them
    still costs a parse and a scan: past MAX_SIGNATURES it is refused unread."""
    signer = seeded_signer("gateway.example/log")
    value = json.loads(make_receipt(_receipt(), signer))
    decoy = {"sig": base64.b64encode(bytes(64)).decode()}
    value["signatures"] += [decoy] * (MAX_SIGNATURES - 1)
    assert verify_receipt(json.dumps(value).encode(), [signer.verifier()]) == _receipt()
    value["signatures"].append(decoy)
    with pytest.raises(MalformedError, match=f"over {MAX_SIGNATURES} signatures"):
        verify_receipt(json.dumps(value).encode(), [signer.verifier()])


def test_checkpoint_text_rules() -> None:
    text = Checkpoint("o", 5, bytes(32)).text()
    assert Checkpoint.parse(text) == Checkpoint("o", 5, bytes(32))
    for bad in ["o\n05\n" + text.split("\n")[2] + "\n", "o\n5\n", "o\n-1\nAA==\n"]:
        with pytest.raises(MalformedError):
            Checkpoint.parse(bad)


def test_verifier_key_errors() -> None:
    vkey = seeded_signer("a").vkey
    with pytest.raises(KeyFormatError, match="does not match"):
        Verifier(vkey.replace("a+", "b+", 1))
    with pytest.raises(KeyFormatError):
        Verifier("no-plus-signs")
