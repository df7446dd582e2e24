"""A tenant's inclusion proof confirms no guess of the completion record beside its
dispatch record.

The proof the tenant fetches (`GET /v1/provenance/proofs/{id}`) of the entry its receipt
names holds, at level 0, the leaf hash of that entry's neighbour. A dispatch record at an
even index has its own completion as that neighbour, and everything in a completion is the
tenant's own or guessable: its request id, the dispatch index and leaf hash its receipt
names, the status and usage it got, the response commitment its salts open, and a time and
a latency to the millisecond between when it sent and when it heard. So hashing guesses of
those two numbers against the neighbour confirmed the record, and with it how long the
attempts took that the tenant never saw (a failed-over request's latency counts the first
attempt's). Completion records now hold `blind` too: 32 random bytes no answer or receipt
gives, as dispatch and refusal records do (tests/integration/test_tenant_isolation.py).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from gateway.canonical import canonical_json
from gateway.provenance import TlogProof, commit
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.receipts import receipt_claims
from gateway.provenance.formats.records import format_time
from tests.helpers.gateways import Gateway, backend, logged_gateway
from tests.helpers.provenance import records
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_response
from tests.helpers.waiting import until

ORIGIN = "test.owngate/completion-blind"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
_TIME, _LATENCY = "T" * 24, 987654321  # placeholders in the guess's encoding


def _first_post_fails() -> Answer:
    """The first request any backend given this answer gets is a 503, every later one a
    whole chat completion: the request fails over once."""
    posts: list[Post] = []

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        posts.append(post)
        if len(posts) == 1:
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        else:
            writer.write(completion_response("hi"))
        await writer.drain()
        return False

    return answer


def _guessed(
    template: dict[str, Any], sent_ms: int, seen_ms: int, wanted: set[bytes]
) -> dict[bytes, tuple[str, int]]:
    """Which of the leaf hashes `wanted` a completion record `template` could be: each
    time it could have been written (a millisecond from `sent_ms`, when the request was
    sent, to `seen_ms`, once the record was seen in the log) and each latency (at most
    the time since the request was sent), with the time and latency that made it."""
    head, _, rest = canonical_json({**template, "time": _TIME, "latency_ms": _LATENCY}).partition(
        str(_LATENCY).encode()
    )  # "latency_ms" sorts before "time"
    middle, _, tail = rest.partition(_TIME.encode())
    found: dict[bytes, tuple[str, int]] = {}
    for ms in range(sent_ms, seen_ms + 1):
        moment = format_time(datetime.fromtimestamp(ms / 1000, UTC))
        before, after = head, middle + moment.encode() + tail
        for latency in range(ms - sent_ms + 2):
            digest = hashlib.sha256(b"\x00%s%d%s" % (before, latency, after)).digest()
            if digest in wanted:
                found[digest] = (moment, latency)
    return found


def test_the_tenants_inclusion_proof_confirms_no_guess_of_its_completion_record(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    answer = _first_post_fails()
    one, two = start_raw(answer), start_raw(answer)
    backends = [backend("a", one.url, "m"), backend("b", two.url, "m")]
    gateway = logged_gateway(start_gateway, tmp_path, backends, ORIGIN)
    sent_ms = int(time.time() * 1000)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    claims = receipt_claims(base64.b64decode(response.headers["x-owngate-receipt"]))
    request_id = response.headers["x-request-id"]
    logged: list[dict[str, Any]] = []

    def all_four_signed() -> bool:
        logged[:] = [r for r in records(tmp_path / "log") if r["request_id"] == request_id]
        return len(logged) == 4

    until(all_four_signed, "both attempts' dispatch and completion records signed")
    # Written by then: a bound on its time that asks nothing of the threads' timing (the
    # client may hear its answer a millisecond before the gateway writes the record).
    seen_ms = int(time.time() * 1000)
    assert [r["type"] for r in logged] == ["dispatch", "completion", "dispatch", "completion"]
    proof_url = f"{gateway.url}/v1/provenance/proofs/{request_id}"
    fetched: list[httpx.Response] = []

    def proof_served() -> bool:
        fetched[:] = [httpx.get(proof_url, headers=gateway.headers, timeout=10)]
        return fetched[0].status_code == 200

    until(proof_served, "the tenant's proof once a checkpoint covers its request")
    proof = TlogProof.parse(fetched[0].text)
    assert proof.index == claims.index == 2  # the served attempt's dispatch
    completion = logged[3]
    neighbour = proof.hashes[0]  # level 0: leaf 3, the served attempt's completion
    assert leaf_hash(canonical_json(completion)) == neighbour

    # The tenant's guess: everything but the time and the latency is what it holds.
    salt = claims.salts.response
    template = {
        "v": 1,
        "type": "completion",
        "request_id": request_id,
        "dispatch": {"index": claims.index, "hash": claims.dispatch_hash.hex()},
        "status": response.status_code,
        "error": None,
        "usage": response.json()["usage"],
        "response_commitment": commit("response", salt, response.content),
    }
    # The record's own time and latency are among the guesses: the search covers it.
    unblinded = {key: value for key, value in completion.items() if key != "blind"}
    assert unblinded == {
        **template,
        "time": unblinded["time"],
        "latency_ms": unblinded["latency_ms"],
    }
    own = leaf_hash(canonical_json(unblinded))
    guesses = _guessed(template, sent_ms, seen_ms, {own, neighbour})
    assert own in guesses
    matched = guesses.get(neighbour)
    assert matched is None, f"the guess (time, latency_ms) {matched} matched the neighbour"
    assert len(completion["blind"]) == 64
    blinds = {r["blind"] for r in logged}
    assert len(blinds) == 4, "each record its own blind"
