"""`owngate audit prove` after a failover: the proof an auditor makes must be of the entry
the client's receipt names.

A request that failed over has a dispatch record per attempt, and the client's receipt
names the attempt its answer came from, the last. `prove REQ` proved the first, so
`proof verify --receipt` failed on the client's own receipt ("another entry"), and no
flag proved the attempt the receipt names. Now `prove` proves the last record of the
type (noting the others on stderr), `--receipt FILE` the entry a receipt names, and
`--index N` any record of the request.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.provenance import TlogProof, load_signer
from tests.helpers.gateways import Gateway, backend, logged_gateway
from tests.helpers.log_truth import (
    CHAT,
    ORIGIN,
    first_attempt_fails,
    salt_of,
    stream_receipt,
)
from tests.helpers.provenance import records, run_audit
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.waiting import until


def _failed_over(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> tuple[Gateway, str, list[int]]:
    """A request whose first attempt got a 503 and whose second answered: the gateway,
    the request's id (its receipt in tmp_path / "receipt.json"), and its records' indices
    once a checkpoint covers all four (dispatch, completion, dispatch, completion)."""
    first_fails = first_attempt_fails()
    one, two = start_raw(first_fails), start_raw(first_fails)
    backends = [backend("a", one.url, "m"), backend("b", two.url, "m")]
    gateway = logged_gateway(start_gateway, tmp_path, backends, ORIGIN)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    receipt = stream_receipt(response.content)
    (tmp_path / "receipt.json").write_bytes(receipt)
    request_id, _ = salt_of(receipt)
    found: list[tuple[int, dict[str, Any]]] = []

    def both_covered() -> bool:
        logged = enumerate(records(tmp_path / "log"))
        found[:] = [(i, r) for i, r in logged if r["request_id"] == request_id]
        return [r["type"] for _, r in found].count("completion") == 2

    until(both_covered, "both attempts' records signed")
    assert [r["type"] for _, r in found] == ["dispatch", "completion", "dispatch", "completion"]
    return gateway, request_id, [i for i, _ in found]


def _prove(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_audit(["prove", str(tmp_path / "log"), *argv])
    return code, out.getvalue(), err.getvalue()


def _verify_with_receipt(tmp_path: Path, proof: str) -> int:
    (tmp_path / "proof").write_text(proof)
    vkey = load_signer(tmp_path / "log.key").vkey
    receipt = str(tmp_path / "receipt.json")
    return run_audit(
        ["proof", "verify", str(tmp_path / "proof"), "--key", vkey, "--receipt", receipt]
    )


def test_the_proof_of_a_failed_over_request_is_of_the_attempt_its_receipt_names(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    _, request_id, indices = _failed_over(start_raw, start_gateway, tmp_path)

    code, by_default, note = _prove(tmp_path, request_id)
    assert code == 0, note
    assert "2 dispatch records" in note and "the last" in note, note
    assert TlogProof.parse(by_default).index == indices[2]  # the second attempt's dispatch
    assert _verify_with_receipt(tmp_path, by_default) == 0

    code, by_receipt, err = _prove(
        tmp_path, request_id, "--receipt", str(tmp_path / "receipt.json")
    )
    assert code == 0, err
    assert by_receipt == by_default
    assert _verify_with_receipt(tmp_path, by_receipt) == 0


def test_each_attempt_can_be_proved_by_its_index(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    _, request_id, (first, _, served, completed) = _failed_over(start_raw, start_gateway, tmp_path)
    code, proof, err = _prove(tmp_path, request_id, "--index", str(first))
    assert code == 0, err
    assert TlogProof.parse(proof).index == first
    assert _verify_with_receipt(tmp_path, proof) == 1  # not the receipt's entry
    code, proof, err = _prove(tmp_path, request_id, "--index", str(served))
    assert code == 0, err
    assert _verify_with_receipt(tmp_path, proof) == 0
    code, proof, err = _prove(tmp_path, request_id, "--index", str(completed))
    assert code == 0, err
    assert b'"type":"completion"' in (TlogProof.parse(proof).extra or b"")
    code, _, err = _prove(tmp_path, request_id, "--index", str(completed), "--record", "dispatch")
    assert code == 1 and "is a completion record, not a dispatch record" in err, err
    code, _, err = _prove(tmp_path, "another-request", "--receipt", str(tmp_path / "receipt.json"))
    assert code == 1 and "the receipt is of request" in err, err


def test_the_tenants_own_proof_after_a_failover_is_of_the_attempt_its_receipt_names(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """`GET /v1/provenance/proofs/{id}`: the client's proof of its own request proves the
    entry its receipt names (the served attempt's dispatch), which `proof verify
    --receipt` accepts; the receipt fetched again is the one the answer carried."""
    gateway, request_id, (first, _, served, _) = _failed_over(start_raw, start_gateway, tmp_path)
    url = f"{gateway.url}/v1/provenance"
    fetched: list[httpx.Response] = []

    def proof_served() -> bool:
        fetched[:] = [httpx.get(f"{url}/proofs/{request_id}", headers=gateway.headers)]
        return fetched[0].status_code == 200

    until(proof_served, "the tenant's proof once a checkpoint covers its request")
    proof = fetched[0].text
    assert TlogProof.parse(proof).index == served != first
    assert _verify_with_receipt(tmp_path, proof) == 0
    again = httpx.get(f"{url}/receipts/{request_id}", headers=gateway.headers)
    assert again.status_code == 200
    assert again.content == (tmp_path / "receipt.json").read_bytes()
