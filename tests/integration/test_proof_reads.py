"""A tenant's `GET /v1/provenance/proofs/{id}` cannot pile reads on the log's checkpoint
thread (a red-team pass over the boundary between tenants, kept as a regression).

An inclusion proof is read from the stored tiles on the checkpoint thread, one call at a
time and in order with the checkpoint exports (gateway/provenance/writer/checkpointer.py),
and the tenant read paths were charged to no limit: every proof request a tenant sent
queued one more read, however many were waiting (0.5 to 0.8 ms each on a log of a few
thousand entries, measured; more on a slow disk), and a client that closes each
connection right after its request leaves its read queued. A checkpoint falling due
waited behind all of them: every tenant's proofs came late, and an export that had not
returned for `export_stall_after_s` (the wait counted) made the log unready and every
tenant's requests 503. Now a process reads at most `PROOF_READS` proofs at once and one
tenant at most `PROOF_READS_PER_TENANT` of them; past either, 429 `rate_limit_exceeded`
with `retry-after: 1` at once, nothing queued.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.api.tenant_reads import PROOF_READS_PER_TENANT
from gateway.provenance.writer.store import LogStore
from gateway.tenants import hash_api_key
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, Gateway, Sim, backend, logged_gateway
from tests.helpers.waiting import until

SENT = PROOF_READS_PER_TENANT + 6  # one tenant's proof requests sent at once


def _chat(gateway: Gateway, key: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}"}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"]


def _proof(gateway: Gateway, key: str, request_id: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    url = f"{gateway.url}/v1/provenance/proofs/{request_id}"
    return httpx.get(url, headers=headers, timeout=60)


def test_one_tenants_proof_reads_are_bounded_and_leave_another_tenant_its_own(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checkpoint thread is held on its first proof read; `acme` sends `SENT` proof
    requests at once. Before, every one waited on the thread (none refused; each would
    have delayed the next checkpoint). Now all but `PROOF_READS_PER_TENANT` are refused
    429 at once, and `other`'s proof request, sent meanwhile, is read (200)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    tenants = [
        {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
        {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
    ]
    gateway = logged_gateway(
        start_gateway, tmp_path, [backend("gpu", sim.url, "m")], "gw.test/proofs", tenants=tenants
    )
    mine, theirs = _chat(gateway, TENANT_KEY), _chat(gateway, OTHER_KEY)
    until(
        lambda: _proof(gateway, OTHER_KEY, theirs).status_code == 200,
        "a checkpoint covers both requests",
    )

    held, released = threading.Event(), threading.Event()
    read = LogStore.inclusion_proof

    def holding(store: LogStore, index: int, size: int | None = None) -> list[bytes]:
        held.set()
        released.wait(60)  # bounded: the test sets it in its `finally`
        return read(store, index, size)

    monkeypatch.setattr(LogStore, "inclusion_proof", holding)
    answers: list[httpx.Response] = []
    with ThreadPoolExecutor(SENT + 1) as pool:
        try:
            futures = [pool.submit(_proof, gateway, TENANT_KEY, mine) for _ in range(SENT)]
            assert held.wait(30), "no proof read reached the checkpoint thread"

            def refused() -> int:
                return sum(f.done() and f.result().status_code == 429 for f in futures)

            until(
                lambda: refused() >= SENT - PROOF_READS_PER_TENANT,
                f"all but {PROOF_READS_PER_TENANT} of acme's {SENT} proof reads refused",
                timeout=30,
                detail=refused,
            )
            other = pool.submit(_proof, gateway, OTHER_KEY, theirs)
        finally:
            released.set()
        answers = [f.result() for f in futures]
        assert other.result().status_code == 200, other.result().text
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * PROOF_READS_PER_TENANT + [429] * (SENT - PROOF_READS_PER_TENANT)
    for answer in answers:
        if answer.status_code == 429:
            assert answer.headers["retry-after"] == "1"
            error = answer.json()["error"]
            assert error["code"] == "rate_limit_exceeded", error
