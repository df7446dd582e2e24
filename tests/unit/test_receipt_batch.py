"""Batch receipts (v2, issue 16): one signature per committed batch, each receipt with its
RFC 6962 path to the signed root. Every forgery below is refused by `verify_receipt`; the
ones marked `naive` would pass a verifier that only checks the batch signature and the
path (`_naive_verify`), which is what each check of the real verifier is there for.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.canonical import canonical_json
from gateway.provenance import (
    LogEntry,
    MalformedError,
    ProofError,
    ProvenanceError,
    ProvenanceLog,
    Receipt,
    Salts,
    SignatureError,
    Signer,
    commit,
    make_receipt,
    refusal_record,
    seal_receipts,
    verify_receipt,
)
from gateway.provenance.formats.attestation import (
    Statement,
    receipt_countersignature,
    sign_statement,
)
from gateway.provenance.formats.dsse import pae, signed_envelope
from gateway.provenance.formats.merkle import leaf_hash, root_from_leaves, verify_inclusion
from gateway.provenance.formats.receipt_batch import (
    BATCH_PAYLOAD_TYPE,
    MAX_BATCH_RECEIPTS,
    MAX_PATH,
)
from gateway.provenance.formats.receipts import (
    MAX_RECEIPT_BYTES,
    RECEIPT_PAYLOAD_TYPE,
    attach_countersignature,
)
from gateway.provenance.testing import EXAMPLE_POLICY, CountingRandom, seeded_signer
from tests.helpers.provenance import run_audit

LOG = "gateway.example/log/1"
SIGNER = seeded_signer(LOG)
VERIFIERS = [SIGNER.verifier()]
SALTS = CountingRandom()


def _receipt(index: int, *, log: str = LOG, backend: str = "vllm-eu-1") -> Receipt:
    return Receipt(
        f"req-{index}",
        log,
        index,
        leaf_hash(b"record %d" % index),
        backend,
        "sha256:" + "ab" * 32,
        Salts(SALTS(32), SALTS(32)),
    )


def _payloads(indices: range | list[int], **fields: str) -> list[tuple[int, bytes]]:
    return [(n, canonical_json(_receipt(n, **fields).payload())) for n in indices]


def _batch(indices: range | list[int], signer: Signer = SIGNER, log: str = LOG) -> list[bytes]:
    return seal_receipts(_payloads(indices), log, signer)


def _value(envelope: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(envelope)
    return value


def _encode(value: dict[str, Any]) -> bytes:
    return canonical_json(value)


def _naive_verify(envelope: bytes) -> None:
    """What a hasty implementation checks: the batch's signature and the path to its root
    (json.loads, lenient base64, nothing else). Raises on failure."""
    value = json.loads(envelope)
    batch = value["batch"]
    signed = base64.b64decode(batch["payload"])
    SIGNER.verifier().verify(
        pae(batch["payloadType"], signed), base64.b64decode(batch["signatures"][0]["sig"])
    )
    statement = json.loads(signed)
    path = [base64.b64decode(item) for item in value["path"]]
    leaf = leaf_hash(base64.b64decode(value["payload"]))
    root = bytes.fromhex(statement["root"])
    verify_inclusion(leaf, value["position"], statement["receipts"], path, root)


def test_every_receipt_of_a_batch_verifies_with_one_signature() -> None:
    for size in (1, 2, 3, 5, 8, 13, 64):
        indices = list(range(100, 100 + 2 * size, 2))  # completions between dispatches
        receipts = _batch(indices)
        statements = {_value(r)["batch"]["payload"] for r in receipts}
        assert len(statements) == 1  # one signed statement for the whole batch
        for position, (index, envelope) in enumerate(zip(indices, receipts, strict=True)):
            value = _value(envelope)
            assert value["position"] == position and len(value["path"]) <= MAX_PATH
            assert envelope == canonical_json(value)
            assert verify_receipt(envelope, VERIFIERS) == Receipt.from_payload(
                json.loads(base64.b64decode(value["payload"]))
            )
            assert verify_receipt(envelope, VERIFIERS).index == index
        statement = json.loads(base64.b64decode(_value(receipts[0])["batch"]["payload"]))
        leaves = [leaf_hash(base64.b64decode(_value(r)["payload"])) for r in receipts]
        assert statement == {
            "v": 1,
            "log": LOG,
            "first": indices[0],
            "entries": indices[-1] - indices[0] + 1,
            "receipts": size,
            "root": root_from_leaves(leaves).hex(),
        }


def test_the_payload_is_the_one_a_v1_receipt_signs_and_v1_still_verifies() -> None:
    receipt = _receipt(7)
    v1 = make_receipt(receipt, SIGNER)
    (v2,) = seal_receipts([(7, canonical_json(receipt.payload()))], LOG, SIGNER)
    assert _value(v1)["payload"] == _value(v2)["payload"]
    assert verify_receipt(v1, VERIFIERS) == verify_receipt(v2, VERIFIERS) == receipt


def test_a_batch_larger_than_the_cap_is_signed_in_parts() -> None:
    receipts = _batch(range(MAX_BATCH_RECEIPTS + 3))
    statements = [json.loads(base64.b64decode(_value(r)["batch"]["payload"])) for r in receipts]
    assert {s["first"] for s in statements} == {0, MAX_BATCH_RECEIPTS}
    assert max(len(_value(r)["path"]) for r in receipts) == MAX_PATH
    for envelope in (receipts[0], receipts[-1]):
        verify_receipt(envelope, VERIFIERS)


def _forge(envelope: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    value = _value(envelope)
    change(value)
    return _encode(value)


def _statement(envelope: bytes) -> dict[str, Any]:
    statement: dict[str, Any] = json.loads(base64.b64decode(_value(envelope)["batch"]["payload"]))
    return statement


def _resign(statement: dict[str, Any], signer: Signer = SIGNER) -> dict[str, object]:
    """A batch envelope over `statement`, signed (the log's key: what only it can make)."""
    return signed_envelope(BATCH_PAYLOAD_TYPE, canonical_json(statement), signer)


def _payload(envelope: bytes) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(base64.b64decode(_value(envelope)["payload"]))
    return payload


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_forgeries_any_verifier_refuses() -> None:
    mine, neighbour, third = _batch([10, 11, 14])
    other_batch = _batch([20, 21])[0]

    def altered(value: dict[str, Any]) -> None:  # a claim changed, encoded canonically
        value["payload"] = _b64(canonical_json({**_payload(mine), "backend": "elsewhere"}))

    def other_path(value: dict[str, Any]) -> None:
        value["path"] = _value(neighbour)["path"]

    def wrong_position(value: dict[str, Any]) -> None:
        value["position"] = 1

    def from_other_batch(value: dict[str, Any]) -> None:
        value["batch"] = _value(other_batch)["batch"]

    def root_swapped(value: dict[str, Any]) -> None:
        # a payload of the forger's own, its leaf made the root of a one-leaf tree, under
        # the log's signature of the honest statement
        payload = canonical_json({**_payload(mine), "backend": "elsewhere"})
        statement = {**_statement(mine), "receipts": 1, "root": leaf_hash(payload).hex()}
        value["batch"] = {**value["batch"], "payload": _b64(canonical_json(statement))}
        value.update(payload=_b64(payload), path=[], position=0)

    cases = {
        "altered payload": (altered, ProofError),
        "path of another receipt": (other_path, ProofError),
        "wrong position": (wrong_position, ProofError),
        "statement of another batch": (from_other_batch, ProvenanceError),
        "root swapped": (root_swapped, SignatureError),
    }
    for name, (change, error) in cases.items():
        forged = _forge(mine, change)
        with pytest.raises(error):
            verify_receipt(forged, VERIFIERS)
        assert name and forged != mine
    verify_receipt(third, VERIFIERS)  # the batch itself is fine


def _signed_batch(payloads: list[bytes], statement: dict[str, Any] | None = None) -> list[bytes]:
    """Receipts over raw payload bytes (each at log index 10 + position) whose statement
    the log's key signs, with `statement`'s members overriding the honest ones: what a
    buggy or subverted sealer could emit, which the verifier must still refuse."""
    leaves = [leaf_hash(payload) for payload in payloads]
    honest = {
        "v": 1,
        "log": LOG,
        "first": 10,
        "entries": len(payloads),
        "receipts": len(payloads),
        "root": root_from_leaves(leaves).hex(),
    }
    batch = _resign({**honest, **(statement or {})})
    out = []
    for position, payload in enumerate(payloads):
        # A one- or two-leaf tree: the path is the sibling leaf, if any.
        path = [] if len(payloads) == 1 else [leaves[1 - position]]
        value = {
            "batch": batch,
            "path": [_b64(node) for node in path],
            "payload": _b64(payload),
            "payloadType": "application/vnd.owngate.receipt+json",
            "position": position,
        }
        out.append(canonical_json(value))
    return out


def _must_refuse_what_naive_accepts(forged: bytes, error: type[Exception], match: str) -> None:
    _naive_verify(forged)  # the forgery is good enough to fool a naive verifier
    with pytest.raises(error, match=match):
        verify_receipt(forged, VERIFIERS)


def test_index_outside_the_batch_is_refused() -> None:
    payload = canonical_json(_receipt(500).payload())
    (forged,) = _signed_batch([payload])  # the statement covers [10, 11)
    _must_refuse_what_naive_accepts(forged, ProofError, "outside its batch")


def test_a_statement_for_another_log_is_refused() -> None:
    # the same key names two logs (e.g. a test and a production log): a receipt of one
    # must not verify through the other's statement
    (forged,) = _signed_batch([canonical_json(_receipt(10).payload())], {"log": "other/log"})
    _must_refuse_what_naive_accepts(forged, ProofError, "batch is of log 'other/log'")
    (theirs,) = seal_receipts(_payloads([10]), LOG, seeded_signer("other/log"))
    with pytest.raises(SignatureError):
        verify_receipt(theirs, VERIFIERS)


def test_duplicated_member_names_are_refused() -> None:
    (honest,) = _batch([10])
    text = honest.decode()
    # the position twice: parsers differ on which one counts
    twice = text[:-1] + ',"position":0}'
    _must_refuse_what_naive_accepts(twice.encode(), MalformedError, "duplicated member")
    # inside the signed payload: json keeps the last backend, other parsers the first
    good = canonical_json(_receipt(10).payload()).decode()
    doubled = good.replace('"backend":', '"backend":"evil","backend":', 1).encode()
    (forged,) = _signed_batch([doubled])
    _must_refuse_what_naive_accepts(forged, MalformedError, "duplicated member")


def test_non_canonical_encodings_are_refused() -> None:
    receipt = _receipt(10).payload()
    spaced = json.dumps(receipt).encode()  # the same claims, not JCS
    (forged,) = _signed_batch([spaced])
    _must_refuse_what_naive_accepts(forged, MalformedError, "not canonical JSON")
    (forged,) = _signed_batch([canonical_json(receipt)], {})
    value = _value(forged)
    statement = json.dumps(_statement(forged)).encode()
    value["batch"] = signed_envelope(BATCH_PAYLOAD_TYPE, statement, SIGNER)
    _must_refuse_what_naive_accepts(_encode(value), MalformedError, "not canonical JSON")
    # base64 whose unused low bits are set decodes to the same bytes
    (honest, _) = _batch([10, 11])
    value = _value(honest)
    last = value["path"][0]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    bumped = alphabet[alphabet.index(last[-2]) + 1]  # 32 bytes: 2 unused bits before "="
    value["path"] = [last[:-2] + bumped + "="]
    _must_refuse_what_naive_accepts(_encode(value), MalformedError, "canonical base64")


def test_oversized_paths_and_batches_are_refused_unread() -> None:
    (honest,) = _batch([10])
    value = _value(honest)
    value["path"] = [None] * 5_000  # never decoded: refused by its length
    with pytest.raises(MalformedError, match=f"at most {MAX_PATH} hashes"):
        verify_receipt(_encode(value), VERIFIERS)
    (forged,) = _signed_batch(
        [canonical_json(_receipt(10).payload())],
        {"receipts": MAX_BATCH_RECEIPTS + 1, "entries": 10**6},
    )
    with pytest.raises(MalformedError, match="at most 1024 receipts"):
        verify_receipt(forged, VERIFIERS)
    value = _value(honest)
    value["batch"] = {**value["batch"], "signatures": value["batch"]["signatures"] * 9}
    with pytest.raises(MalformedError, match="over 8 signatures"):
        verify_receipt(_encode(value), VERIFIERS)
    huge = honest.replace(b'"position":0', b'"position":' + b"9" * 5000)
    with pytest.raises(MalformedError, match="not JSON"):  # past int()'s digit limit
        verify_receipt(huge, VERIFIERS)


def test_a_signature_under_another_key_id_is_refused() -> None:
    (honest,) = _batch([10])
    value = _value(honest)
    signature = dict(value["batch"]["signatures"][0], keyid="someone-else+00000000")
    value["batch"] = {**value["batch"], "signatures": [signature]}
    _must_refuse_what_naive_accepts(_encode(value), SignatureError, "not signed by a trusted")


def test_a_re_encoded_receipt_still_verifies() -> None:
    """The receipt's own JSON is not what is signed: pretty-printed, it still verifies."""
    (honest,) = _batch([10])
    assert verify_receipt(json.dumps(_value(honest), indent=2).encode(), VERIFIERS)


def test_flipping_any_byte_of_a_batch_receipt_fails() -> None:
    receipts = _batch(range(40, 45))
    envelope = receipts[3]
    verify_receipt(envelope, VERIFIERS)
    for position in range(len(envelope)):
        for mask in (0x01, 0x20, 0x80):
            flipped = bytearray(envelope)
            flipped[position] ^= mask
            with pytest.raises(ProvenanceError):
                verify_receipt(bytes(flipped), VERIFIERS)


def _refusal(number: int) -> dict[str, object]:
    return refusal_record(
        request_id=f"req-{number}",
        time=datetime(2026, 1, 1, tzinfo=UTC),
        tenant="acme",
        model="m",
        policy=EXAMPLE_POLICY,
        trace=[],
        rule="deny",
        reason="policy_denied",
        request_commitment=None,
    )


class _CountingSigner:
    def __init__(self, signer: Signer) -> None:
        self._signer = signer
        self.signed = 0
        self.lock = threading.Lock()

    def sign(self, message: bytes) -> bytes:
        with self.lock:
            self.signed += 1
        return self._signer.sign(message)

    def __str__(self) -> str:
        return str(self._signer)


def test_the_log_signs_once_per_committed_batch(tmp_path: Path) -> None:
    counting = _CountingSigner(seeded_signer(LOG, seed=2))

    async def scenario() -> tuple[list[bytes], int]:
        log = await ProvenanceLog.open(
            tmp_path,
            LOG,
            seeded_signer(LOG),
            batch_seal=lambda pairs: seal_receipts(pairs, LOG, counting),  # type: ignore[arg-type]
        )

        def seal(entry: LogEntry) -> bytes:
            return canonical_json(_receipt(entry.index).payload())

        placed = await asyncio.gather(*(log.append_sealed(_refusal(n), seal) for n in range(24)))
        receipts = [await sealing for _, sealing in placed]
        batches = log.batches
        await log.close()
        return receipts, batches

    receipts, batches = asyncio.run(scenario())
    assert counting.signed == batches < 24  # one signature per committed batch
    verifiers = [counting._signer.verifier()]
    assert [verify_receipt(r, verifiers).index for r in receipts] == list(range(24))


def test_a_receipt_alone_in_its_batch_can_be_a_v1_receipt() -> None:
    """The gateway's choice (`lone_v1`): a batch of one is signed as a v1 receipt, the same
    one signature over the same payload, without a statement and path to carry."""
    payloads = _payloads([10])
    (lone,) = seal_receipts(payloads, LOG, SIGNER, lone_v1=True)
    assert set(_value(lone)) == {"payload", "payloadType", "signatures"}
    assert _value(lone)["payload"] == _b64(payloads[0][1])
    assert verify_receipt(lone, VERIFIERS).index == 10
    (batched,) = seal_receipts(payloads, LOG, SIGNER)
    assert len(lone) < len(batched) and "batch" in _value(batched)
    two = seal_receipts(_payloads([10, 12]), LOG, SIGNER, lone_v1=True)
    assert all("batch" in _value(envelope) for envelope in two)


def test_a_failing_seal_fails_its_own_receipt_and_a_failing_batch_seal_all(
    tmp_path: Path,
) -> None:
    async def scenario(batch_fails: bool) -> list[bytes | BaseException]:
        def batch(pairs: Any) -> list[bytes]:
            if batch_fails:
                raise RuntimeError("no key")
            return seal_receipts(pairs, LOG, SIGNER)

        directory = tmp_path / str(batch_fails)
        log = await ProvenanceLog.open(directory, LOG, SIGNER, batch_seal=batch)

        def seal(entry: LogEntry) -> bytes:
            if entry.index == 1:
                raise ValueError("unsealable")
            return canonical_json(_receipt(entry.index).payload())

        placed = await asyncio.gather(*(log.append_sealed(_refusal(n), seal) for n in range(4)))
        results = await asyncio.gather(*(s for _, s in placed), return_exceptions=True)
        assert log.size == 4  # durable whatever the seals did
        await log.close()
        return results

    sealed = asyncio.run(scenario(batch_fails=False))
    assert isinstance(sealed[1], ValueError)  # only its own receipt
    for index in (0, 2, 3):
        envelope = sealed[index]
        assert isinstance(envelope, bytes) and verify_receipt(envelope, VERIFIERS).index == index
    failed = asyncio.run(scenario(batch_fails=True))
    assert isinstance(failed[1], ValueError)
    assert all(isinstance(failed[n], RuntimeError) for n in (0, 2, 3))


def test_a_batch_receipt_carries_an_attested_backends_countersignature() -> None:
    """Receipts of attested backends keep their `attestation` member in the batch form,
    verified as for v1: by the backend's key, for the receipt's request."""
    backend = seeded_signer("gpu-a")
    salts = Salts(SALTS(32), SALTS(32))
    receipt = dataclasses.replace(_receipt(10), request_id="req-1", backend="gpu-a", salts=salts)
    neighbour = _receipt(11)
    payloads = [(r.index, canonical_json(r.payload())) for r in (receipt, neighbour)]
    mine = seal_receipts(payloads, LOG, SIGNER)[0]
    statement = Statement(
        "req-1",
        "2026-01-01T00:00:00.000Z",
        3,
        str(backend),
        commit("request", salts.request, b"{}"),
        commit("response", salts.response, b"{}"),
    )
    carried = attach_countersignature(mine, sign_statement(statement, backend))
    assert "attestation" in _value(carried) and "batch" in _value(carried)
    assert verify_receipt(carried, VERIFIERS) == receipt
    keys = {"gpu-a": backend.verifier()}
    found = receipt_countersignature(carried, receipt, keys)
    assert found is not None and found.counter == 3
    with pytest.raises(SignatureError, match="carries no countersignature"):
        receipt_countersignature(mine, receipt, keys)
    other = seeded_signer("gpu-a", seed=7)
    theirs = dataclasses.replace(statement, key=str(other))
    forged = attach_countersignature(mine, sign_statement(theirs, other))
    with pytest.raises(SignatureError):
        receipt_countersignature(forged, receipt, keys)


def test_a_receipt_past_the_size_cap_is_refused_unparsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A genuine receipt is 1-3 KB; one padded past MAX_RECEIPT_BYTES (whitespace is
    valid JSON) is refused before it is parsed, and the CLI reads no more of the file
    than that: a client's receipt file cannot make the auditor's tools hold gigabytes."""
    (honest,) = _batch([10])
    padded = honest[:-1] + b" " * MAX_RECEIPT_BYTES + b"}"
    assert verify_receipt(honest[:-1] + b" " * 1000 + b"}", VERIFIERS).index == 10
    with pytest.raises(MalformedError, match=f"over {MAX_RECEIPT_BYTES} bytes"):
        verify_receipt(padded, VERIFIERS)
    path = tmp_path / "receipt.json"
    path.write_bytes(padded)
    assert run_audit(["receipt", "verify", str(path), "--key", SIGNER.vkey]) == 1
    assert f"over {MAX_RECEIPT_BYTES} bytes" in capsys.readouterr().err


def test_a_countersignature_json_cannot_encode_is_a_failed_check_not_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `attestation` member is the receipt holder's to shape: an integer past 64 bits,
    a lone surrogate or nesting past orjson's depth is a malformed countersignature (exit
    1, FAILED), not an 'error: ... lone surrogate' exit 2 as if the auditor erred."""
    backend = seeded_signer("gpu-a")
    receipt = dataclasses.replace(_receipt(10), backend="gpu-a")
    mine = seal_receipts([(10, canonical_json(receipt.payload()))], LOG, SIGNER)[0]
    path = tmp_path / "receipt.json"
    argv = ["receipt", "verify", str(path), "--key", SIGNER.vkey]
    argv += ["--backend-key", f"gpu-a={backend.vkey}"]
    deep: object = []
    for _ in range(300):
        deep = [deep]
    shapes: list[tuple[object, str]] = [
        ({"n": 10**30}, "outside the I-JSON range"),
        ({"n": "\ud800"}, "lone surrogate"),
        (deep, "nested deeper than"),  # not reported as a lone surrogate
    ]
    for shape, cause in shapes:
        path.write_bytes(json.dumps({**_value(mine), "attestation": shape}).encode())
        assert run_audit(argv) == 1
        said = capsys.readouterr().err
        assert "FAILED: " in said and cause in said, said
        if cause != "lone surrogate":
            assert "surrogate" not in said


@pytest.mark.parametrize("version", [True, 1.0])
def test_a_version_that_is_not_the_integer_1_is_refused(version: object) -> None:
    # `true` and `1.0` equal 1 in Python, and `{"v":true}` is its own JCS encoding: they
    # passed `v != 1`, where a verifier that reads `v` as an integer (Go, Rust) refuses
    # them, so one signed receipt read as valid or not depending on the auditor's parser.
    claims = _receipt(10).payload()
    raw = json.dumps({**claims, "v": version}, sort_keys=True, separators=(",", ":"))
    v1 = canonical_json(signed_envelope(RECEIPT_PAYLOAD_TYPE, raw.encode(), SIGNER))
    with pytest.raises(MalformedError, match="v=1"):
        verify_receipt(v1, VERIFIERS)
    if version is True:  # a float is not JCS, refused as such: the statement's `v`
        (forged,) = _signed_batch([canonical_json(claims)], {"v": version})
        with pytest.raises(MalformedError, match="wrong type"):
            verify_receipt(forged, VERIFIERS)
